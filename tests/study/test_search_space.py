"""Search spaces and SLO flags: bad specs are one-line errors naming the key; the CLI exits 2."""

from __future__ import annotations

import pytest
import yaml

from pulseinfer.cli import EXIT_BAD_INPUT, main
from study.slo import TailSlo, parse_slo
from study.space import SpaceError, check_space, load_space, parse_space


def _params(spec: dict) -> dict:
    return {"params": {"policy.pulseinfer.budget_tokens": spec}}


BAD_SPACES = [
    ("empty_range", _params({"low": 4096, "high": 1024}), ["policy.pulseinfer.budget_tokens", "empty range"]),
    ("empty_choices", _params({"choices": []}), ["policy.pulseinfer.budget_tokens", "choices"]),
    ("unknown_range_field", _params({"lo": 1, "high": 2}), ["policy.pulseinfer.budget_tokens", "'lo'"]),
    ("missing_high", _params({"low": 1}), ["policy.pulseinfer.budget_tokens", "high"]),
    ("log_needs_positive_low", _params({"low": 0, "high": 8, "log": True}), ["budget_tokens", "low > 0"]),
    ("log_and_step", _params({"low": 1, "high": 8, "log": True, "step": 2}), ["budget_tokens", "log or step"]),
    ("choices_plus_range", _params({"choices": [1], "low": 1}), ["budget_tokens", "choices"]),
    ("repeated_choice", _params({"choices": [16, 16]}), ["budget_tokens", "repeat"]),
    ("unknown_top_level", {"parmas": {}}, ["space.parmas"]),
    ("no_params", {"params": {}}, ["space.params"]),
    ("policy_list", {"params": {"policies": {"choices": ["sglang"]}}}, ["params.policies"]),
    (
        "two_policies",
        {"params": {"policy.a.budget_tokens": {"low": 1, "high": 2}, "policy.b.budget_tokens": {"low": 1, "high": 2}}},
        ["space.policy"],
    ),
    (
        "other_policy",
        {"policy": "pulseinfer", "params": {"policy.headwise.budget_tokens": {"low": 1, "high": 2}}},
        ["policy.headwise.budget_tokens", "headwise"],
    ),
]


@pytest.mark.parametrize(("data", "needles"), [c[1:] for c in BAD_SPACES], ids=[c[0] for c in BAD_SPACES])
def test_bad_space_is_one_line_error_naming_the_key(data, needles):
    with pytest.raises(SpaceError) as info:
        parse_space(data)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


def test_int_range_float_range_and_choices_parse():
    space = parse_space(
        {
            "params": {
                "policy.pulseinfer.budget_tokens": {"low": 512, "high": 2048, "step": 512},
                "policy.pulseinfer.admission_slack": {"low": -0.25, "high": 1.0},
                "policy.pulseinfer.block_size": {"choices": [16, 32]},
            }
        }
    )
    assert space.policy == "pulseinfer"
    budget, slack, block = space.params
    assert budget.is_int and not slack.is_int
    assert block.choices == (16, 32)


def test_unknown_scenario_key_names_the_key(tiny_overrides):
    space = parse_space({"params": {"policy.pulseinfer.budget_tokns": {"low": 1, "high": 2}}})
    with pytest.raises(SpaceError) as info:
        check_space(space, "default", tiny_overrides)
    message = str(info.value)
    assert "params.policy.pulseinfer.budget_tokns" in message and "unknown scenario key" in message
    assert "; " not in message  # the loader's message is one location, not its parts joined


def test_out_of_range_bound_names_the_key_and_value(tiny_overrides):
    space = parse_space(_params({"low": 0, "high": 2048}))
    with pytest.raises(SpaceError, match=r"params.policy.pulseinfer.budget_tokens: value 0 is not valid"):
        check_space(space, "default", tiny_overrides)


def test_shipped_space_validates_on_the_default_scenario():
    space = load_space("pulseinfer")
    check_space(space, "default", [])
    assert space.policy == "pulseinfer" and len(space.params) >= 8


def test_slo_flag_parses_into_p99_bounds_in_seconds():
    assert parse_slo("tpot_p99_ms=50,ttft_p99_s=10") == TailSlo(tpot_p99_s=0.05, ttft_p99_s=10.0)
    assert parse_slo("ttft_p99_s=2").describe() == "ttft_p99_s=2"


@pytest.mark.parametrize(
    ("text", "needle"),
    [("tpot_p95_ms=50", "tpot_p95_ms"), ("tpot_p99_ms=-1", "tpot_p99_ms"), ("tpot_p99_ms", "tpot_p99_ms"),
     ("ttft_p99_s=x", "ttft_p99_s"), ("tpot_p99_ms=5,tpot_p99_ms=6", "tpot_p99_ms")],
)  # fmt: skip
def test_bad_slo_flag_names_the_key(text, needle):
    with pytest.raises(ValueError, match=needle):
        parse_slo(text)


def test_slo_violations_are_nonpositive_exactly_when_met():
    slo = TailSlo(tpot_p99_s=0.05, ttft_p99_s=10.0)
    good = {"tpot_p99_s": 0.04, "ttft_p99_s": 9.0, "incomplete": 0, "finished": 3}
    assert slo.met(good) and all(v <= 0 for v in slo.violations(good).values())
    assert not slo.met(good | {"tpot_p99_s": 0.06})
    assert not slo.met(good | {"incomplete": 1})
    assert not slo.met(good | {"finished": 0, "tpot_p99_s": float("nan")})


def _cli_error(capsys, argv: list[str]) -> str:
    assert main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_search_cli_bad_space_key_exits_2(tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"params": {"policy.pulseinfer.chunk_byte": {"low": 1, "high": 2}}}))
    line = _cli_error(capsys, ["search", "--space", str(space), "--out", str(tmp_path / "o"), "--no-progress"])
    assert "policy.pulseinfer.chunk_byte" in line


def test_search_cli_empty_range_exits_2(tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(_params({"low": 9, "high": 3})))
    line = _cli_error(capsys, ["search", "--space", str(space), "--out", str(tmp_path / "o"), "--no-progress"])
    assert "budget_tokens" in line and "empty range" in line


def test_search_and_plan_cli_bad_slo_key_exit_2(tmp_path, capsys):
    out = str(tmp_path / "o")
    line = _cli_error(capsys, ["search", "--space", "pulseinfer", "--slo", "tbt_ms=5", "--out", out, "--no-progress"])
    assert "tbt_ms" in line
    line = _cli_error(capsys, ["plan", "--slo", "tpot_p99_ms=50,ttft=3", "--out", out, "--no-progress"])
    assert "ttft" in line


def test_plan_cli_unknown_hardware_exits_2(tmp_path, capsys):
    line = _cli_error(capsys, ["plan", "--hardware", "h300", "--out", str(tmp_path / "o"), "--no-progress"])
    assert "h300" in line

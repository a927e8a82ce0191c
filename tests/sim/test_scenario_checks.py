"""Scenario loading refuses silent nonsense: repeated keys, YAML syntax errors, overrides of policies that do not
run, and impossible geometry; each is one line naming the key, the value and the bound (exit 2 in the CLI)."""

from __future__ import annotations

import pytest

from pulseinfer.cli import main
from sim.config import ScenarioError, load_scenario
from sim.config.profiles import ProfileError, read_profile


def _write(tmp_path, text: str, name: str = "s.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_repeated_key_names_the_key_and_both_lines(tmp_path):
    path = _write(tmp_path, "name: a\nworkload:\n  max_requests: 5\n  time_scale: 2\n  max_requests: 7\n")
    with pytest.raises(ScenarioError, match=r"key 'max_requests' appears twice .* line 3 and line 5"):
        load_scenario(path)


def test_repeated_section_is_refused(tmp_path):
    path = _write(tmp_path, "workload:\n  max_requests: 5\nseed: 1\nworkload:\n  time_scale: 2\n")
    with pytest.raises(ScenarioError, match=r"key 'workload' appears twice .* line 1 and line 4"):
        load_scenario(path)


def test_repeated_key_in_a_profile_is_refused(tmp_path):
    path = _write(tmp_path, "name: p\nname: q\n", "profile.yaml")
    with pytest.raises(ProfileError, match=r"^profile: .*key 'name' appears twice .* line 1 and line 2"):
        read_profile(path)


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [("name: a\nworkload: [1, 2\n", 3, 1), ("name: a\n  bad: indent\n", 2, 6), ('name: "open\n', 2, 1)],
)
def test_yaml_syntax_error_gives_file_line_and_column(tmp_path, text, line, column):
    path = _write(tmp_path, text)
    with pytest.raises(ScenarioError, match=rf"{path}: not valid YAML at line {line}, column {column}: "):
        load_scenario(path)


def test_override_of_a_policy_that_does_not_run_names_it_and_the_policies():
    with pytest.raises(ScenarioError, match=r"--set policy\.pulsenfer\.budget_tokens: policy 'pulsenfer' is not run "
                       r"\(policies: sglang, full_offload, headwise, pulseinfer\)"):  # fmt: skip
        load_scenario(None, ["policy.pulsenfer.budget_tokens=1024"])


def test_override_of_a_policy_added_by_another_override_is_accepted():
    sc = load_scenario(None, ["policy.headwise.budget_tokens=1024", "policies=sglang,headwise"])
    assert sc.policy["headwise"].budget_tokens == 1024


@pytest.mark.parametrize("knob", ["budget_tokens", "sink_tokens", "recent_tokens", "offload_threshold_tokens"])
def test_window_longer_than_the_context_is_refused(knob):
    sc = load_scenario(None)
    too_long = sc.model.max_seq_len + 1
    extra = ["policy.pulseinfer.recall_buffer_blocks=100000"] if knob == "budget_tokens" else []
    with pytest.raises(ScenarioError, match=rf"^policy\.pulseinfer\.{knob}: {too_long} tokens exceeds the model's "
                       rf"context \(model\.max_seq_len = {sc.model.max_seq_len}"):  # fmt: skip
        load_scenario(None, [f"policy.pulseinfer.{knob}={too_long}", *extra])


def test_lookahead_deeper_than_the_model_is_refused():
    layers = load_scenario(None).model.num_layers
    with pytest.raises(ScenarioError, match=rf"lookahead_layers: {layers + 1} exceeds .*num_layers = {layers}"):
        load_scenario(None, [f"policy.pulseinfer.lookahead_layers={layers + 1}"])
    assert load_scenario(None, [f"policy.pulseinfer.lookahead_layers={layers}"]).policy["pulseinfer"]


def test_offload_policy_that_can_never_offload_is_refused_but_dense_runs():
    with pytest.raises(ScenarioError, match=r"offload_threshold_tokens: .* does not fit in hardware\.host_dram_gib"):
        load_scenario(None, ["hardware.host_dram_gib=0.5"])
    assert load_scenario(None, ["hardware.host_dram_gib=0.5", "policies=sglang"]).policies == ["sglang"]


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["policy.pulseinfer.sink_tokens=999999"], "sink_tokens: 999999"),
        (["policy.pulseinfr.budget_tokens=1"], "policy 'pulseinfr' is not run"),
        (["hardware.host_dram_gib=0.01"], "host_dram_gib = 0.01"),
        (["policy.pulseinfer.lookahead_layers=99"], "lookahead_layers: 99"),
    ],
)
def test_cli_prints_one_line_and_exits_2(capsys, overrides, needle):
    args = ["simulate", "--no-progress"] + [a for o in overrides for a in ("--set", o)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and needle in err


def test_enormous_synthetic_workload_is_refused_with_the_estimate(capsys, monkeypatch):
    import sim.config.checks as checks

    monkeypatch.setattr(checks, "available_memory_bytes", lambda: 2**30)
    synthetic = ["workload.trace=null", "workload.synthetic.rate_per_s=1", "workload.synthetic.prompt_tokens_mean=100",
                 "workload.synthetic.output_tokens_mean=10"]  # fmt: skip
    assert load_scenario(None, [*synthetic, "workload.synthetic.num_requests=1000"])  # 4 MB: fits
    args = ["simulate", "--no-progress"] + [a for o in synthetic for a in ("--set", o)]
    assert main([*args, "--set", "workload.synthetic.num_requests=1000000000000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "workload.synthetic.num_requests: 1000000000000 requests need about 3,814,697.3 GiB" in err
    assert "1.0 GiB available" in err


@pytest.mark.parametrize("text", ["", "# only a comment\n"], ids=["empty", "comment"])
def test_an_empty_scenario_file_says_it_is_empty(tmp_path, text):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match="the file is empty"):
        load_scenario(str(path))


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("hardware.hbm_gib=yes", "hbm_gib: expected a number, got the boolean true"),
        ("serving.tp_size=off", "tp_size: expected a number, got the boolean false"),
        ("model.dtype=on", "dtype: expected a name, got the boolean true"),
        ("policy.pulseinfer.selection=no", "selection: expected a name, got the boolean false"),
        # inside a mapping or list of scalars (pydantic's lax mode would read 1.0 there)
        ("cost.gpu_hour_usd.h200=yes", "gpu_hour_usd.h200: expected a number, got the boolean true"),
        ("hardware.h2d_size_table=[[4096, yes], [1048576, 50]]", "h2d_size_table.0.1: expected a number"),
        ("policies=sglang,yes", "policies.1: expected a name, got the boolean true"),
    ],
)
def test_a_boolean_where_a_number_or_a_name_belongs_says_which(override, expected):
    """YAML reads yes/no/on/off as booleans; the message names what the field wants (a number for a numeric
    field, a name for a choice), not both."""
    with pytest.raises(ScenarioError, match=expected):
        load_scenario("default", [override])

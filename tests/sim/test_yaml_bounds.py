"""sim.config.files: YAML loading is bounded (file size, nesting, alias expansion) and error messages never show a
value in full, so a hostile or mistaken input file gets one short ``ScenarioError`` instead of a hang."""

from __future__ import annotations

import tracemalloc

import pytest
from pydantic import BaseModel, ValidationError

from sim.config import files
from sim.config.files import (
    MAX_YAML_BYTES,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    SHOWN_ERRORS,
    ScenarioError,
    format_validation_error,
    parse_yaml,
    read_yaml,
    short_repr,
)
from sim.config.loader import load_scenario


def billion_laughs(levels: int = 9, fan: int = 9) -> str:
    """The classic alias bomb: ``levels`` mappings, each a list of ``fan`` aliases of the one before (fan**levels
    values once expanded, a few hundred bytes written)."""
    names = [chr(ord("a") + i) for i in range(levels)]
    lines = [f"{names[0]}: &{names[0]} [{', '.join(['lol'] * fan)}]"]
    for prev, name in zip(names, names[1:]):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * fan)}]")
    return "\n".join(lines) + "\n"


def _refusal(text: str) -> str:
    with pytest.raises(ScenarioError) as exc:
        parse_yaml(text, "bomb.yaml")
    return str(exc.value)


def test_alias_bomb_is_refused_early_in_bounded_memory_with_a_short_message():
    text = billion_laughs()
    assert len(text) < 700 and 9**9 > MAX_YAML_NODES
    tracemalloc.start()
    try:
        message = _refusal(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, f"peak {peak / 2**20:.1f} MiB"  # the expansion (9^9 values) was never built
    assert len(message) < 300 and "\n" not in message
    assert message.startswith("bomb.yaml: line ") and f"{MAX_YAML_NODES:,}" in message


def test_alias_bomb_scenario_file_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(billion_laughs())
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path)
    assert str(path) in str(exc.value) and len(str(exc.value)) < 300


def test_expansion_at_the_limit_loads_and_one_more_value_is_refused(monkeypatch):
    text = "c: &c [1, 2]\nd: [*c, *c, *c, *c]\n"  # c: 3 values; d: 1 + 4 x 3 = 13; top: 1 + (1 + 3) + (1 + 13) = 19
    monkeypatch.setattr(files, "MAX_YAML_NODES", 19)
    assert parse_yaml(text, "t.yaml") == {"c": [1, 2], "d": [[1, 2]] * 4}
    monkeypatch.setattr(files, "MAX_YAML_NODES", 18)
    assert "more than 18 values" in _refusal(text)


def test_ordinary_anchors_and_merge_keys_still_load():
    text = "base: &base {block_size: 16, budget_tokens: 2048}\nvariant:\n  <<: *base\n  budget_tokens: 1024\n"
    assert parse_yaml(text, "t.yaml")["variant"] == {"block_size": 16, "budget_tokens": 1024}


def test_an_alias_inside_its_own_anchor_is_refused():
    assert "contains it" in _refusal("a: &a [1, *a]\n")


def test_nesting_deeper_than_the_limit_is_refused_not_a_recursion_error():
    deep = MAX_YAML_DEPTH + 1
    assert f"nested more than {MAX_YAML_DEPTH} levels" in _refusal("a: " + "[" * deep + "]" * deep + "\n")
    assert "nested more than" in _refusal("a: " + "[" * 5000 + "]" * 5000 + "\n")
    ok = MAX_YAML_DEPTH - 1  # the top-level mapping is one level
    assert parse_yaml("a: " + "[" * ok + "]" * ok + "\n", "t.yaml") is not None


@pytest.mark.parametrize(
    ("text", "needle"),
    [("seed: " + "9" * 5000 + "\n", "4300 digits"), ("date: 2020-13-45\n", "month must be in 1..12")],
    ids=["int_beyond_python_digit_limit", "impossible_date"],
)
def test_a_value_python_cannot_build_is_a_yaml_error_with_its_line(text, needle):
    message = _refusal(text)
    assert message.startswith("bomb.yaml: not valid YAML at line 1, column 7: ") and needle in message
    assert len(message) < 300


def test_a_file_just_over_the_size_limit_is_refused_naming_file_and_limit(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_bytes(b"a: " + b"x" * (MAX_YAML_BYTES - 3) + b"\n")  # one byte over
    with pytest.raises(ScenarioError) as exc:
        read_yaml(path, what="profile: ")
    message = str(exc.value)
    assert message.startswith(f"profile: {path}: ") and f"{MAX_YAML_BYTES:,}" in message and len(message) < 300


def test_a_file_at_the_size_limit_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "MAX_YAML_BYTES", 64)
    path = tmp_path / "edge.yaml"
    path.write_text("a: " + "x" * 60 + "\n")  # exactly 64 bytes
    assert read_yaml(path) == {"a": "x" * 60}
    path.write_text("a: " + "x" * 61 + "\n")
    with pytest.raises(ScenarioError, match="limit of 64 bytes"):
        read_yaml(path)


def test_text_over_the_size_limit_is_refused_before_parsing(monkeypatch):
    monkeypatch.setattr(files, "MAX_YAML_BYTES", 10)
    with pytest.raises(ScenarioError, match="t.yaml: 12 bytes, more than"):
        parse_yaml("a: [1, 2, 3]", "t.yaml")


def test_short_repr_is_bounded_for_huge_shared_and_long_values():
    shared = ["x"] * 9
    for _ in range(9):  # 9**10 leaves through shared references, as a YAML alias bomb constructs
        shared = [shared] * 9
    for value in (shared, "q" * 10**6, list(range(10**5)), {str(i): i for i in range(1000)}):
        assert len(short_repr(value)) <= 80
    assert short_repr("h200") == "'h200'"
    text = short_repr("head" + "q" * 1000 + "tail")
    assert text.startswith("'head") and text.endswith("tail'") and "..." in text


@pytest.mark.parametrize(
    "override",
    ["seed=" + "q" * 100_000, "model=" + "q" * 100_000, "nonsense=[" + ",".join(["7"] * 20_000) + "]"],
    ids=["bad_int", "unknown_card_name", "unknown_key_with_a_long_list"],
)
def test_a_long_value_in_a_bad_field_gives_a_capped_message(override):
    with pytest.raises(ScenarioError) as exc:
        load_scenario(None, [override])
    message = str(exc.value)
    assert override.partition("=")[0] in message and "q" * 100 not in message and message.count("7") < 20
    assert len(message) < 300, message


class _Numbers(BaseModel):
    values: list[int]


def test_many_validation_errors_are_listed_up_to_a_count():
    with pytest.raises(ValidationError) as exc:
        _Numbers.model_validate({"values": ["x"] * 1000})
    message = format_validation_error(exc.value)
    assert message.count("values.") == SHOWN_ERRORS
    assert message.endswith(f"and {1000 - SHOWN_ERRORS} more error(s)")


def test_an_alias_bomb_in_a_set_value_is_refused_naming_the_key():
    flow = "{" + billion_laughs().strip().replace("\n", ", ") + "}"  # the same bomb as one flow mapping
    with pytest.raises(ScenarioError) as exc:
        load_scenario(None, ["policy.sglang.note=" + flow])
    message = str(exc.value)
    assert message.startswith("--set policy.sglang.note: ") and f"{MAX_YAML_NODES:,}" in message


def test_a_set_value_python_cannot_build_stays_a_string():
    with pytest.raises(ScenarioError, match=r"seed: Input should be a valid integer.*got '2020-13-45'"):
        load_scenario(None, ["seed=2020-13-45"])

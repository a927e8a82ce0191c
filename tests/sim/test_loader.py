"""sim.config.loader: ``--set`` override parsing, card expansion under dotted keys, and one-line error messages."""

from __future__ import annotations

import pytest
import yaml

from sim.config import HardwareSpec
from sim.config.loader import ScenarioError, _parse_override, load_card, load_scenario, resolve_scenario_path


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("seed=2048", 2048),
        ("workload.time_scale=0.5", 0.5),
        ("run.debug_checks=true", True),
        ("run.debug_checks=false", False),
        ("run.horizon_s=null", None),
        ("run.horizon_s=", None),
        ("name=pd_run", "pd_run"),
    ],
)
def test_override_value_parses_as_a_yaml_scalar(item, expected):
    key, value = _parse_override(item)
    assert key == item.partition("=")[0]
    assert value == expected and type(value) is type(expected)


def test_override_key_and_value_are_split_at_the_first_equals():
    assert _parse_override(" name = a=b ") == ("name", "a=b")


def test_null_override_reaches_the_scenario_as_none():
    assert load_scenario(None, ["run.horizon_s=5"]).run.horizon_s == 5.0
    assert load_scenario(None, ["run.horizon_s=5", "run.horizon_s=null"]).run.horizon_s is None


def test_single_policy_override_gives_a_one_element_list():
    assert load_scenario(None, ["policies=sglang"]).policies == ["sglang"]


def test_comma_separated_policies_give_a_two_element_list():
    assert load_scenario(None, ["policies=pulseinfer,sglang"]).policies == ["pulseinfer", "sglang"]


def test_dotted_override_into_a_card_name_keeps_the_other_fields():
    scenario = load_scenario(None, ["hardware=h100-sxm", "hardware.h2d_bandwidth_gbps=25"])
    card = HardwareSpec.model_validate(load_card("hardware", "h100-sxm"))
    assert scenario.hardware.h2d_bandwidth_gbps == 25
    same = {"h2d_bandwidth_gbps": card.h2d_bandwidth_gbps, "reserve_gib": None}  # the engine sets the reserve
    assert scenario.hardware.model_copy(update=same) == card


def test_dotted_override_into_a_model_card_keeps_the_other_fields():
    base = load_scenario(None)
    scenario = load_scenario(None, ["model.max_seq_len=32768"])
    assert scenario.model.max_seq_len == 32768
    assert scenario.model.model_copy(update={"max_seq_len": base.model.max_seq_len}) == base.model


def test_validation_error_names_the_dotted_location_and_the_value():
    with pytest.raises(ScenarioError) as exc:
        load_scenario(None, ["policy.pulseinfer.miss_frac=1.5"])
    message = str(exc.value)
    assert "policy.pulseinfer.miss_frac" in message
    assert "1.5" in message
    assert "\n" not in message


def test_validation_error_inside_a_card_names_the_card_field():
    with pytest.raises(ScenarioError, match=r"hardware\.hbm_efficiency.*1\.2"):
        load_scenario(None, ["hardware.hbm_efficiency=1.2"])


def test_override_through_a_scalar_is_rejected_naming_the_key():
    with pytest.raises(ScenarioError, match=r"workload\.trace is not a mapping"):
        load_scenario(None, ["workload.trace.path=x"])


def test_comma_in_a_string_field_is_kept():
    assert load_scenario(None, ["workload.trace=runs/a,b.jsonl"]).workload.trace == "runs/a,b.jsonl"


def test_written_ablation_scenario_loads_back(tmp_path):
    from sim.config import dump_scenario

    scn = load_scenario("ablation")
    dump_scenario(scn, tmp_path / "scenario.yaml")
    assert load_scenario(tmp_path / "scenario.yaml") == scn


def test_a_card_file_of_your_own_is_read_by_its_path(tmp_path):
    """``--set hardware=PATH.yaml`` / ``engine=PATH.yaml``: the user's card file, not a shipped name; a dotted
    override on top of it still applies."""
    card = load_card("hardware", "h100-sxm")
    own = tmp_path / "my-gpu.yaml"
    own.write_text(yaml.safe_dump({**card, "name": "my-gpu", "hbm_gib": 141.0}))
    engine = tmp_path / "engine.yaml"
    own_engine = {"name": "my-engine", "inherits": "vllm-0.11", "source": "a test", "step_serial_us": 123.0}
    engine.write_text(yaml.safe_dump(own_engine))  # host costs over a line (its scheduler)
    scn = load_scenario("default", [f"hardware={own}", f"engine={engine}", "hardware.hbm_bandwidth_gbps=4000"])
    assert (scn.hardware.name, scn.hardware.hbm_gib, scn.hardware.hbm_bandwidth_gbps) == ("my-gpu", 141.0, 4000)
    assert scn.hardware.bf16_tflops == card["bf16_tflops"]
    assert (scn.engine.name, scn.engine.step_serial_us) == ("my-engine", 123.0)


def test_a_missing_card_file_is_named():
    with pytest.raises(ScenarioError, match="hardware: no such card file 'nope/my-gpu.yaml'"):
        load_scenario("default", ["hardware=nope/my-gpu.yaml"])


def test_a_scenario_files_own_card_is_read_beside_it(tmp_path, monkeypatch):
    """``hardware: my-gpu.yaml`` in a scenario file is the file next to the scenario (as its profile is), whatever
    the working folder."""
    folder = tmp_path / "scenarios"
    folder.mkdir()
    (folder / "my-gpu.yaml").write_text(yaml.safe_dump({**load_card("hardware", "h200"), "name": "beside"}))
    shipped = yaml.safe_load(resolve_scenario_path("default").read_text())
    (folder / "mine.yaml").write_text(yaml.safe_dump({**shipped, "hardware": "my-gpu.yaml"}))
    monkeypatch.chdir(tmp_path)  # not the scenario's folder
    assert load_scenario(str(folder / "mine.yaml")).hardware.name == "beside"


def test_a_card_file_that_is_not_a_card_says_what_it_is(tmp_path):
    """A profile passed as a card points to ``--set profile=``; a shipped name with ``.yaml`` to the name; an empty
    file names the field that named it."""
    profile = tmp_path / "h200.yaml"
    profile.write_text(yaml.safe_dump({"name": "fit", "hardware": load_card("hardware", "h200")}))
    with pytest.raises(ScenarioError, match=r"hardware: '.*h200.yaml' is a profile .* use --set profile="):
        load_scenario("default", [f"hardware={profile}"])
    with pytest.raises(ScenarioError, match="the shipped card is named h100-sxm, without .yaml"):
        load_scenario("default", ["hardware=h100-sxm.yaml"])
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ScenarioError, match=r"^hardware: .*empty.yaml: the file is empty"):
        load_scenario("default", [f"hardware={tmp_path / 'empty.yaml'}"])

"""Published cases (calibrate/cases.py, ``pulseinfer cases``): shipped files load, the table and verdicts."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest

from calibrate.cases import (
    CASE_COLUMNS,
    CaseError,
    CaseSpec,
    Quantity,
    _quantity,
    case_names,
    cases_dir,
    error_pct,
    io_modes,
    load_case,
    run_case,
    verdict,
)
from pulseinfer.cli import main


@pytest.mark.parametrize("name", case_names())
def test_every_shipped_case_file_loads_and_names_its_source_and_tolerance(name):
    spec = load_case(cases_dir() / f"{name}.yaml")
    assert spec.name == name
    assert spec.source.strip() and spec.metric.strip()
    assert spec.tolerance_pct > 0


def test_the_suite_covers_the_issue_cases():
    names = set(case_names())
    assert {"sparseserve_fall", "sparseserve_admission", "vllm_batched_copy", "h100_copy_cost"} <= names
    assert {"nvbandwidth_d2h_a100", "decode_step_llama8b_h100", "decode_step_qwen14b_h200"} <= names


def test_cases_command_runs_a_link_and_a_simulated_case_end_to_end(tmp_path, capsys):
    only = "nvbandwidth_d2h_gen5,decode_step_llama8b_h100"
    assert main(["cases", "--only", only, "--out", str(tmp_path), "--no-progress"]) == 0
    table = pd.read_csv(tmp_path / "cases.csv")
    assert list(table.columns) == CASE_COLUMNS
    assert list(table["case"]) == only.split(",")
    assert set(table["verdict"]) <= {"within", "outside", "not_modelled"}
    assert table["simulated"].notna().all()
    # the verdict follows from the error and the stated tolerance
    for row in table.itertuples():
        assert (row.verdict == "within") == (abs(row.error_pct) <= row.tolerance_pct)
    assert "decode_step_llama8b_h100" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("simulated", "published", "expected"),
    [(110.0, 100.0, 10.0), (90.0, 100.0, -10.0), (20.0, (15.0, 25.0), 0.0), (12.0, (15.0, 25.0), -20.0),
     (30.0, (15.0, 25.0), 20.0)],
)  # fmt: skip
def test_error_is_relative_to_the_value_or_the_nearer_end_of_the_range(simulated, published, expected):
    assert error_pct(simulated, published) == pytest.approx(expected)


def test_verdict_is_within_only_inside_the_tolerance():
    assert verdict(10.0, 10.0) == "within"
    assert verdict(-10.0, 10.0) == "within"
    assert verdict(10.01, 10.0) == "outside"
    assert verdict(-10.01, 10.0) == "outside"
    assert verdict(error_pct(math.nan, 1.0), 50.0) == "outside"


def test_a_case_needing_a_missing_io_mode_is_reported_not_modelled_with_the_reason():
    missing = "no_such_io_mode"
    assert missing not in io_modes()
    spec = CaseSpec.model_validate(
        {"name": "x", "source": "s", "metric": "m", "published": 2.0, "tolerance_pct": 10, "requires_io": [missing],
         "compute": {"kind": "link", "hardware": "h100-sxm", "quantity": "copy_us"}}
    )  # fmt: skip
    row = run_case(spec)
    assert row["verdict"] == "not_modelled"
    assert math.isnan(row["simulated"]) and missing in row["note"]


def test_a_list_of_points_takes_the_peak_and_steps_filter_by_batch():
    summary = {"a": SimpleNamespace(summary={"tok": 3.0}), "b": SimpleNamespace(summary={"tok": 5.0})}
    assert _quantity(Quantity(point=["a", "b"], column="tok"), summary) == 5.0
    steps = pd.DataFrame(
        {"phase": ["decode", "decode", "decode", "prefill"], "batch_size": [4, 4, 3, 4], "duration_s": [1, 3, 9, 27]}
    )
    result = {"a": SimpleNamespace(steps=steps)}
    assert _quantity(Quantity(point="a", column="duration_s", table="steps", batch_size=4), result) == 2.0


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("name: x\nsource: s\nmetric: m\npublished: 1\ncompute: {kind: link, hardware: h200, quantity: copy_us}\n",
         "tolerance_pct"),
        ("name: x\nsource: s\nmetric: m\npublished: 1\ntolerance_pct: 5\ntolerence: 3\n"
         "compute: {kind: link, hardware: h200, quantity: copy_us}\n", "tolerence"),
        ("name: x\nsource: s\nmetric: m\npublished: 1\ntolerance_pct: 5\ncompute: {kind: simulate, points: {p: []},"
         " numerator: {point: q, column: c}}\n", "compute.numerator.point"),
        ("name: x\nsource: [unclosed\n", "not valid YAML"),
    ],
)  # fmt: skip
def test_a_malformed_case_file_gives_one_line_naming_the_file_and_key(tmp_path, text, key):
    path = tmp_path / "bad_case.yaml"
    path.write_text(text)
    with pytest.raises(CaseError) as info:
        load_case(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message and key in message


def test_an_unknown_case_name_is_one_error_line_and_exit_2(tmp_path, capsys):
    assert main(["cases", "--only", "no_such_case", "--out", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "no_such_case" in err[0]

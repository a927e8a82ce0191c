"""``pulseinfer simulate`` fleets and bills, ``--gpu-hour-usd`` for simulate and plan, and plan's cheapest fleet
per card (issue 34)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from pulseinfer.cli import EXIT_BAD_INPUT, main
from study.plan import PLAN_COLUMNS, cheapest_fleets

TINY = [
    "workload.trace=null",
    "workload.synthetic.num_requests=8",
    "workload.synthetic.rate_per_s=10",
    "workload.synthetic.prompt_tokens_mean=1000",
    "workload.synthetic.output_tokens_mean=20",
    "policies=sglang",
]


def _sets(overrides: list[str]) -> list[str]:
    return [arg for item in overrides for arg in ("--set", item)]


def _no_simulation(*_args, **_kwargs):
    raise AssertionError("a bad flag must be refused before anything is simulated")


def test_simulate_a_priced_fleet_writes_replicas_and_the_bill(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["simulate", *_sets([*TINY, "serving.replicas=2", "serving.router=least_tokens"]), "--no-progress"]
    assert main([*args, "--gpu-hour-usd", "H200=2.5,b200=9", "--out", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "2 replicas x TP1 behind least_tokens" in shown and "$/M out tok" in shown and "TPOT p50 ms" in shown
    summary = pd.read_csv(out / "summary.csv").iloc[0]
    assert summary["num_replicas"] == 2 and summary["router"] == "least_tokens"
    assert summary["gpu_hour_usd"] == 2.5 and summary["usd_per_hour"] == pytest.approx(summary["gpus"] * 2.5)
    assert len(pd.read_csv(out / "replicas.csv")) == 2
    assert "h200: 2.5" in (out / "scenario.yaml").read_text()


def test_a_price_for_another_card_is_said_not_silently_dropped(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["simulate", *_sets(TINY), "--no-progress", "--gpu-hour-usd", "h100-sxm=3", "--out", str(out)]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "note: --gpu-hour-usd prices h100-sxm, not this scenario's card h200" in err
    assert "usd_per_hour" not in pd.read_csv(out / "summary.csv").columns


@pytest.mark.parametrize(
    ("value", "needles"),
    [
        ("foo=1", ["--gpu-hour-usd foo", "unknown card 'foo'", "h200", "a100-80gb"]),
        ("h200=0", ["--gpu-hour-usd h200", "positive price"]),
        ("h200", ["--gpu-hour-usd h200", "CARD=PRICE"]),
        ("h200=1,H200=2", ["--gpu-hour-usd H200", "priced twice"]),
    ],
)
@pytest.mark.parametrize("command", ["simulate", "plan"])
def test_bad_gpu_hour_usd_exits_2_with_one_line(tmp_path, capsys, monkeypatch, command, value, needles):
    monkeypatch.setattr("sim.run.simulate", _no_simulation)
    monkeypatch.setattr("study.plan.run_plan", _no_simulation)
    code = main([command, *_sets(TINY), "--gpu-hour-usd", value, "--out", str(tmp_path / "o"), "--no-progress"])
    assert code == EXIT_BAD_INPUT
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and all(n in lines[0] for n in needles), lines
    assert not (tmp_path / "o").exists()


def _row(hardware, router, replicas, meets, usd_per_hour, per_million):
    row = dict.fromkeys(PLAN_COLUMNS)
    row.update(
        hardware=hardware, policy="sglang", router=router, replicas_for_target=replicas, meets_slo=meets,
        target_rate_per_s=8.0, usd_per_hour=usd_per_hour, usd_per_million_output_tokens=per_million,
    )  # fmt: skip
    return row


def test_cheapest_fleets_keeps_the_cheapest_slo_meeting_row_per_card_sorted_by_cost():
    table = pd.DataFrame(
        [
            _row("h100-sxm", "round_robin", 10, True, 25.0, 1.0),
            _row("h100-sxm", "least_tokens", 9, True, 22.5, 0.9),
            _row("h200", "round_robin", 4, False, 14.0, 0.5),  # misses: never the answer
            _row("h200", "least_tokens", 6, True, 21.0, 0.8),
            _row("a100-80gb", "round_robin", 20, True, None, None),  # no price
        ],
        columns=PLAN_COLUMNS,
    )
    best = cheapest_fleets(table)
    assert list(best["hardware"]) == ["h200", "h100-sxm"]
    assert list(best["replicas_for_target"]) == [6, 9] and not any(math.isnan(x) for x in best["usd_per_hour"])

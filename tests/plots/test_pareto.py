"""The Pareto figure (plots/pareto.py): the front helper, the figure's marks, and ``plan``/``sweep`` writing it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba

from plots.pareto import pareto_figure, pareto_front, slo_text
from plots.style import MissingData
from pulseinfer.cli import main

# ---- pareto_front ----------------------------------------------------------------------------------------------


def test_pareto_front_keeps_only_undominated_points_sorted_by_x():
    x = [1.0, 2.0, 3.0, 2.5, 1.5, 4.0]
    y = [10.0, 8.0, 5.0, 4.0, 9.5, 1.0]  # (2.5, 4) is dominated by (3, 5); the rest trade x for y
    assert pareto_front(x, y).tolist() == [0, 4, 1, 2, 5]


def test_pareto_front_ties_equal_points_stay_and_a_tie_on_one_axis_is_dominated():
    x = [1.0, 1.0, 1.0, 2.0, 2.0, 0.5]
    y = [5.0, 3.0, 5.0, 2.0, 2.0, 5.0]
    # (1, 3): same x as (1, 5), lower y. (0.5, 5): same y as (1, 5), lower x. (1, 5) twice and (2, 2) twice: kept.
    assert pareto_front(x, y).tolist() == [0, 2, 3, 4]


def test_pareto_front_ignores_non_finite_points_and_minimises_a_negated_cost():
    x = np.array([1.0, np.nan, 3.0, 2.0, np.inf])
    cost = np.array([1.0, 0.1, 5.0, 6.0, 0.1])  # lower is better: (2, 6) is dominated by (3, 5)
    assert pareto_front(x, -cost).tolist() == [0, 2]
    assert pareto_front([], []).tolist() == []
    with pytest.raises(ValueError, match="differ in length"):
        pareto_front([1.0, 2.0], [1.0])


# ---- pareto_figure ---------------------------------------------------------------------------------------------


def _points(priced: bool = True) -> pd.DataFrame:
    rows = []
    for hardware, scale, price in (("h100-sxm", 1.0, 2.5), ("h200", 1.4, 3.5)):
        for policy, boost in (("sglang", 1.0), ("pulseinfer", 1.2)):
            for k, rate in enumerate((0.5, 1.0, 2.0, 4.0)):
                tokens = 100.0 * rate * scale * boost
                rows.append({
                    "hardware": hardware, "policy": policy, "tp_size": 1, "engine": "sglang-0.4", "rate_per_s": rate,
                    "decode_tokens_per_s": tokens, "tpot_mean_s": 0.01 * (1 + k) / scale, "gpus": 2,
                    "meets_slo": k < 3, "gpu_hour_usd": price,
                    "usd_per_million_output_tokens": price * 2 / 3600 / tokens * 1e6 if priced else None,
                })  # fmt: skip
    return pd.DataFrame(rows)


def test_figure_without_the_needed_columns_or_rows_raises_missing_data():
    with pytest.raises(MissingData, match="tpot_mean_s"):
        pareto_figure(_points().drop(columns="tpot_mean_s"))
    with pytest.raises(MissingData, match="no rows"):
        pareto_figure(_points().iloc[:0])
    nan = _points().assign(tpot_mean_s=np.nan)
    with pytest.raises(MissingData, match="finite"):
        pareto_figure(nan)


def test_figure_draws_a_cost_panel_only_with_prices_and_the_slo_at_one_over_the_bound():
    priced = pareto_figure(_points(), slo_tpot_s=0.05, title="plan: 2 cards x 2 policies")
    assert len(priced.axes) == 2 and priced.axes[1].get_yscale() == "log"
    assert priced.get_suptitle() == "plan: 2 cards x 2 policies"
    vertical = [line for line in priced.axes[0].get_lines() if list(line.get_xdata()) == [20.0, 20.0]]
    assert vertical, "the TPOT SLO line at x = 1 / 50 ms"
    assert len(pareto_figure(_points(priced=False)).axes) == 1


def test_figure_fills_slo_meeting_points_rings_the_front_and_labels_what_varies():
    fig = pareto_figure(_points(), slo_tpot_s=0.05)
    ax = fig.axes[0]
    white = to_rgba("white")
    filled = hollow = 0
    for coll in ax.collections:
        faces = coll.get_facecolors()
        if len(faces) and len(coll.get_offsets()):
            n = len(coll.get_offsets())
            if tuple(faces[0]) == white:
                hollow += n
            elif faces[0][3] > 0:
                filled += n
    assert (filled, hollow) == (12, 4)  # 3 of each configuration's 4 loads meet the SLO
    # The rings: one unfilled scatter of the front of the SLO-meeting points.
    x = 1 / _points()["tpot_mean_s"].to_numpy()
    y = _points()["decode_tokens_per_s"].to_numpy() / 2
    met = _points()["meets_slo"].to_numpy()
    front = pareto_front(x[met], y[met])
    rings = [c for c in ax.collections if len(c.get_facecolors()) == 0 and len(c.get_offsets()) == len(front)]
    assert rings and np.allclose(rings[0].get_offsets(), np.c_[x[met][front], y[met][front]])
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "h200 · pulseinfer" in texts  # TP and engine are shared: named in the legend title, not each entry
    assert "TP1" in fig.legends[0].get_title().get_text()


def test_slo_text_names_the_bounds_in_their_units():
    assert slo_text({"tpot_p99_s": 0.05, "ttft_p99_s": 10.0}) == "tpot_p99 50 ms, ttft_p99 10 s"
    assert slo_text({}) == "none"


# ---- plan and sweep write it -----------------------------------------------------------------------------------

TINY = [
    "workload.trace=null",
    "workload.time_scale=1",
    "workload.synthetic.num_requests=20",
    "workload.synthetic.rate_per_s=2",
    "workload.synthetic.prompt_tokens_mean=4000",
    "workload.synthetic.output_tokens_mean=30",
    "workload.synthetic.prompt_tokens_cv=0",
    "workload.synthetic.output_tokens_cv=0",
    "serving.prefill=colocated",
    "run.progress=false",
]
SETS = [arg for item in TINY for arg in ("--set", item)]


def test_plan_writes_one_point_per_single_replica_simulation_and_the_figure(tmp_path, capsys, monkeypatch):
    import study.plan
    from study.plan import POINT_COLUMNS

    singles = []
    simulate_policy = study.plan.simulate_policy

    def counted(scenario, workload, policy):
        singles.append(policy)
        return simulate_policy(scenario, workload, policy)

    monkeypatch.setattr(study.plan, "simulate_policy", counted)
    argv = ["plan", "--slo", "ttft_p99_s=1", "--hardware", "h200", "--policies", "sglang,pulseinfer"]
    argv += ["--max-requests", "20", "--target-rate", "6", "--routers", "round_robin", "--gpu-hour-usd", "h200=3"]
    assert main([*argv, "--out", str(tmp_path), "--no-progress", *SETS]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'plan.csv'}, {tmp_path / 'plan_points.csv'}, {tmp_path / 'pareto.png'}" in out
    plan = pd.read_csv(tmp_path / "plan.csv")
    points = pd.read_csv(tmp_path / "plan_points.csv", keep_default_na=False, na_values=[""])
    assert list(points.columns) == POINT_COLUMNS
    assert len(points) == len(singles) > 0
    assert len(points) < plan["num_simulations"].sum()  # the fleets are not points
    for (hardware, policy), cell in points.groupby(["hardware", "policy"]):
        assert cell["rate_per_s"].is_monotonic_increasing and cell["rate_per_s"].is_unique
        best = plan[(plan["hardware"] == hardware) & (plan["policy"] == policy)].iloc[0]
        at_max = cell[np.isclose(cell["rate_per_s"], best["max_rate_per_s"])]
        assert len(at_max) == 1 and bool(at_max["meets_slo"].iloc[0])
        assert not cell[cell["rate_per_s"] > best["max_rate_per_s"] * 1.2]["meets_slo"].any()
    assert (points["engine"] == "sglang-0.4").all() and (points["gpus"] == 1).all()
    assert points["usd_per_million_output_tokens"].notna().all()
    assert (tmp_path / "pareto.png").stat().st_size > 0


def test_sweep_writes_gpus_and_the_pareto_figure(tmp_path, capsys):
    argv = ["sweep", "default", *SETS, "--grid", "workload.synthetic.rate_per_s=1,4", "--policies", "sglang"]
    assert main([*argv, "--slo", "ttft_p99_s=5", "--out", str(tmp_path), "--no-progress"]) == 0
    assert f"{tmp_path / 'pareto.png'}" in capsys.readouterr().out
    table = pd.read_csv(tmp_path / "sweep.csv")
    assert (table["gpus"] == 1).all() and "usd_per_million_output_tokens" not in table.columns
    assert (tmp_path / "pareto.png").stat().st_size > 0


def test_sweep_points_average_seeds_and_join_along_the_load_key():
    from pulseinfer.commands.sweep import load_key, pareto_points

    assert load_key(["workload.synthetic.prompt_tokens_mean", "workload.synthetic.rate_per_s"]) == (
        "workload.synthetic.rate_per_s"
    )
    assert load_key(["workload.target_rate_per_s"]) == "workload.target_rate_per_s"
    assert load_key(["policy.pulseinfer.budget_tokens"]) is None
    table = pd.DataFrame({
        "workload.synthetic.rate_per_s": [1, 1, 2, 2], "policy": ["a"] * 4, "seed": [0, 1, 0, 1],
        "slo_met": [True, False, False, False], "decode_tokens_per_s": [10.0, 20.0, 30.0, 50.0],
        "tpot_mean_s": [0.01, 0.03, 0.02, 0.04], "gpus": [2, 2, 2, 2],
    })  # fmt: skip
    points = pareto_points(table, ["workload.synthetic.rate_per_s"])
    assert points["decode_tokens_per_s"].tolist() == [15.0, 40.0]
    assert points["tpot_mean_s"].tolist() == pytest.approx([0.02, 0.03])
    assert points["meets_slo"].tolist() == [True, False]  # at least half of the seeds

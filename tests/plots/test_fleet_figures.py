"""A fleet's figures (issue 49, plots/fleet.py): drawn by ``simulate --plots`` and ``pulseinfer plot`` for a fleet
folder, skipped with a note for a single-replica one; what each panel counts; every registered figure's caption."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection

from plots.fleet import MAX_REPLICA_LINES, fleet_latency_cdf, prefill_pool, replica_batch, replica_kv, replica_load
from plots.render import FIGURES
from plots.style import MissingData
from plots.tables import read_table
from pulseinfer.cli import main

FLEET_FIGURES = ["fleet_latency_cdf", "prefill_pool", "replica_batch", "replica_kv", "replica_load"]
TINY = [
    "workload.trace=null",
    "workload.synthetic.num_requests=20",
    "workload.synthetic.rate_per_s=4",
    "workload.synthetic.prompt_tokens_mean=4000",
    "workload.synthetic.output_tokens_mean=30",
]


def _simulate(out, *sets: str, plots: bool = False) -> int:
    args = ["simulate", "--out", str(out), "--no-progress", *[a for s in [*TINY, *sets] for a in ("--set", s)]]
    return main([*args, "--plots"] if plots else args)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A two-replica fleet (disaggregated prefill, the default scenario's four policies) simulated with --plots."""
    out = tmp_path_factory.mktemp("fleet") / "results"
    assert _simulate(out, "serving.replicas=2", plots=True) == 0
    return out


def _lines(fig) -> dict[str, list]:
    """Every labelled line of the figure's axes, by label (a label in several panels: one entry each)."""
    found: dict[str, list] = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            found.setdefault(line.get_label(), []).append(line)
    return found


def test_simulate_plots_a_fleet_with_every_fleet_figure(fleet):
    for name in FLEET_FIGURES:
        assert (fleet / "plots" / f"{name}.png").stat().st_size > 5000, name
    series = read_table(fleet, "replica_series")
    assert {"policy", "replica", "time_s", "batch_size", "kv_used_gib"} <= set(series.columns)
    assert set(series["replica"]) == {0, 1}


def test_plot_of_a_single_replica_folder_skips_the_fleet_figures_with_a_note(tmp_path, capsys):
    assert _simulate(tmp_path / "one", "policies=sglang") == 0
    capsys.readouterr()
    assert main(["plot", str(tmp_path / "one"), "--out", str(tmp_path / "figs")]) == 0
    out = capsys.readouterr().out
    for name in FLEET_FIGURES:
        assert f"skipped {name}: " in out, name
        assert not (tmp_path / "figs" / f"{name}.png").exists()
    assert "skipped replica_load: requests.csv has no replica column: one replica, not a fleet" in out
    assert "skipped replica_batch: replica_series.csv not in" in out
    assert (tmp_path / "figs" / "tpot_cdf.png").is_file()


def test_the_prefill_pool_needs_disaggregated_prefill(fleet):
    requests = read_table(fleet, "requests")
    assert prefill_pool(requests, "disaggregated", 8) is not None
    for prefill in ("colocated", "none", None):
        with pytest.raises(MissingData, match="no remote prefill pool"):
            prefill_pool(requests, prefill, 8)


def _requests(rows: list[tuple]) -> pd.DataFrame:
    cols = ["policy", "replica", "arrival_s", "first_token_s", "finish_s", "unfinished_reason", "ttft_s", "tpot_s"]
    return pd.DataFrame(rows, columns=cols)


NAN = math.nan
# replica 0: [0, 4) and [1, 3) overlap (2 outstanding in [1, 3)); a rejection never is; replica 1: one request cut by
# the horizon stays outstanding to the end
REQUESTS = _requests([
    ("sglang", 0, 0.0, 0.5, 4.0, NAN, 0.5, 0.01),
    ("sglang", 0, 1.0, 2.0, 3.0, NAN, 1.0, 0.02),
    ("sglang", 0, 1.5, NAN, NAN, "exceeds_kv_pool", NAN, NAN),
    ("sglang", 1, 0.5, 0.6, 2.5, NAN, 0.1, 0.01),
    ("sglang", 1, 2.0, NAN, NAN, "horizon", NAN, NAN),
])  # fmt: skip


def _y_at(line, t: float) -> float:
    x, y = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
    return float(y[np.searchsorted(x, t, "right") - 1])


def test_replica_load_counts_outstanding_requests_per_replica():
    lines = _lines(replica_load(REQUESTS))
    r0, r1 = lines["replica 0"][0], lines["replica 1"][0]
    assert [_y_at(r0, t) for t in (0.5, 1.2, 1.6, 3.5, 4.5)] == [1, 2, 2, 1, 0]  # the rejection is never outstanding
    assert [_y_at(r1, t) for t in (0.2, 1.0, 2.2, 3.9)] == [0, 1, 2, 1]  # the cut request to the end


def test_prefill_pool_counts_requests_from_arrival_to_first_token():
    fig = prefill_pool(REQUESTS, "disaggregated", 1)
    lines = _lines(fig)
    r0 = lines["replica 0"][0]
    assert [_y_at(r0, t) for t in (0.2, 0.7, 1.2, 2.5)] == [1, 0, 1, 0]
    assert _y_at(lines["replica 1"][0], 3.0) == 1  # no first token: still in prefill at the end
    assert lines["prefill GPUs per replica (1)"][0].get_ydata()[0] == 1


def _series(replicas: int, policies=("sglang", "pulseinfer")) -> pd.DataFrame:
    rows = []
    for policy in policies:
        for r in range(replicas):
            for i in range(40):
                t = 0.1 * i + 0.01 * r
                rows.append((policy, r, t, "decode", 1 + (r + i) % 4, 0, 2.0 + r + 0.1 * i, 20.0, 60.0))
            rows.append((policy, r, 1.05, "prefill", 99, 0, 3.0, 20.0, 61.0))
    cols = ["policy", "replica", "time_s", "phase", "batch_size", "num_offloaded", "kv_used_gib", "kv_pool_gib"]
    return pd.DataFrame(rows, columns=[*cols, "hbm_used_gib"])


def test_replica_batch_draws_decode_steps_only_one_line_per_replica():
    fig = replica_batch(_series(3))
    lines = _lines(fig)
    assert sorted(k for k in lines if k.startswith("replica")) == ["replica 0", "replica 1", "replica 2"]
    assert len(lines["replica 0"]) == 2  # one per policy panel
    drawn = np.concatenate([line.get_ydata() for k, ls in lines.items() if k.startswith("replica") for line in ls])
    assert np.nanmax(drawn) == 4  # the prefill rows' batch (99 chunks) is not a decode batch


def test_many_replicas_draw_a_band_and_the_median():
    series = _series(MAX_REPLICA_LINES + 2)
    fig = replica_batch(series)
    lines = _lines(fig)
    assert "replica 0" not in lines and len(lines["median replica"]) == 2
    bands = [c for ax in fig.axes for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2 and bands[0].get_label() == f"{MAX_REPLICA_LINES + 2} replicas: min-max"


def test_replica_kv_draws_the_pool_when_in_scale_and_names_it_otherwise():
    lines = _lines(replica_kv(_series(2)))
    assert lines["device KV pool"][0].get_ydata()[0] == 20.0
    far = _series(2).assign(kv_pool_gib=1000.0)
    fig = replica_kv(far)
    assert "device KV pool" not in _lines(fig)
    assert "device KV pool per replica 1e+03 GiB: far above the lines" in fig.legends[0].get_title().get_text()


def test_a_sampled_line_is_blank_where_a_replica_sampled_no_step():
    series = _series(1, ("sglang",))
    series = series[(series["time_s"] < 1.0) | (series["time_s"] > 3.0)]  # idle from 1 s to 3 s
    y = np.asarray(_lines(replica_kv(series))["replica 0"][0].get_ydata(), float)
    assert np.isnan(y).sum() == 1 and np.isfinite(y).sum() == len(series)


def test_fleet_latency_cdf_labels_each_policy_with_its_router():
    requests = pd.concat([REQUESTS, REQUESTS.assign(policy="pulseinfer", tpot_s=REQUESTS["tpot_s"] * 2)])
    summary = pd.DataFrame({"policy": ["sglang", "pulseinfer"], "router": ["least_tokens", "least_tokens"],
                            "num_replicas": [2, 2]})  # fmt: skip
    fig = fleet_latency_cdf(requests, summary, slo_ttft_s=2.0, slo_tpot_s=0.05)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(label.startswith("sglang, 2 x least_tokens (p50") for label in labels)
    assert any(label.startswith("pulseinfer, 2 x least_tokens") for label in labels) and "SLO 50 ms" in labels
    assert len(fig.axes) == 2
    with pytest.raises(MissingData, match="router"):
        fleet_latency_cdf(requests, summary.drop(columns="router"))


def test_every_figure_has_a_one_sentence_caption():
    assert {spec.name for spec in FIGURES} >= set(FLEET_FIGURES)
    for spec in FIGURES:
        caption = spec.caption
        assert len(caption) > 40 and caption.endswith(".") and ". " not in caption, spec.name

"""The sweep heatmap: one cell per grid point, hatched where A loses to B, SLO edges where the met flags change."""

from __future__ import annotations

import matplotlib
import numpy as np
import pandas as pd
import pytest

from plots.style import MissingData
from plots.sweep import LOSS_FRAC, sweep_ratio_heatmap

matplotlib.use("Agg")


def _compare(panels=(None,)) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    rows = []
    for panel in panels:
        for y in (1, 2, 4):
            for x in (4096, 8192, 16384, 32768):
                rows.append(
                    {
                        "hw": panel,
                        "x": x,
                        "y": y,
                        "ratio": float(rng.uniform(0.5, 3.0)),
                        "a_slo_met_frac": float(x <= 8192 or y == 1),  # an L-shaped region
                        "b_slo_met_frac": float(x <= 4096),
                    }
                )
    return pd.DataFrame(rows)


def _edges(met: np.ndarray) -> int:
    return int((met[:, 1:] != met[:, :-1]).sum() + (met[1:, :] != met[:-1, :]).sum())


def test_cells_hatches_and_slo_edges():
    compare = _compare()
    fig = sweep_ratio_heatmap(compare, "x", "y", "pulseinfer", "sglang", "goodput_requests_per_s")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "x" and ax.get_ylabel() == "y"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4K", "8K", "16K", "32K"]
    assert len(ax.texts) == len(compare)  # one ratio label per cell
    assert len(ax.patches) == int((compare["ratio"] < 1 - LOSS_FRAC).sum())  # hatched where A loses to B
    grid = compare.pivot(index="y", columns="x")
    expected = _edges(grid["a_slo_met_frac"].to_numpy() >= 0.5) + _edges(grid["b_slo_met_frac"].to_numpy() >= 0.5)
    assert len(ax.get_lines()) == expected


def test_panels_and_missing_columns():
    fig = sweep_ratio_heatmap(_compare(("h200", "h100")), "x", "y", "a", "b", "m", panel_key="hw")
    assert [ax.get_title() for ax in fig.axes[:2]] == ["hw=h200", "hw=h100"]
    with pytest.raises(MissingData, match="ratio"):
        sweep_ratio_heatmap(_compare().drop(columns="ratio"), "x", "y", "a", "b", "m")

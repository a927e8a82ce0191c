"""A figure too large for its dpi is written at the highest dpi that fits, with a warning (never a MemoryError)."""

from __future__ import annotations

import warnings

import pytest
from matplotlib.figure import Figure

import plots.render
from plots.render import _save


def test_oversized_png_is_written_at_a_fitting_dpi_with_a_warning(tmp_path, monkeypatch):
    limit = 1_000_000  # small, so the test draws a small PNG; the rule is the same at the shipped limit
    monkeypatch.setattr(plots.render, "MAX_FIGURE_PIXELS", limit)
    fig = Figure(figsize=(30.0, 10.0))
    fig.add_subplot().plot([0, 1], [0, 1])
    with pytest.warns(UserWarning, match=r"wide\.png: 30\.0 x 10\.0 in at --dpi 20000 .* written at dpi (\d+)") as rec:
        path = _save(fig, tmp_path / "wide.png", dpi=20000)
    fitted = int(str(rec[0].message).rsplit(" ", 1)[1])
    assert 30 * 10 * fitted**2 <= limit < 30 * 10 * (fitted + 1) ** 2
    assert path.stat().st_size > 0


def test_a_figure_within_the_limit_keeps_its_dpi(tmp_path):
    fig = Figure(figsize=(4.0, 3.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _save(fig, tmp_path / "small.png", dpi=100)

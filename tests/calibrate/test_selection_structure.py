"""The structure fit (calibrate/selection_structure.py) recovers known drift and fresh-block parameters from a
synthetic selection-statistics table, and the simulator's structured draws persist as specified."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from calibrate.selection_structure import fit_structure, layer_sigma
from sim.config import HardwareSpec, ModelSpec, OffloadPolicy, RecallStatsSpec
from sim.config.loader import load_card
from sim.step.link import LinkModel
from sim.step.recall import RecallModel
from tests.sim.oracles import recall_step

BLOCK = 16


def _table(rng, drift_sigma, fresh_frac, layers=30, steps=400, rate=2.0):
    """Per (layer, step) misses: Poisson(rate · drift_t) plus, every BLOCK steps, Bernoulli(fresh_frac) per layer."""
    x = np.zeros(steps)
    for t in range(1, steps):
        x[t] = 0.3 * x[t - 1] + np.sqrt(1 - 0.09) * rng.standard_normal()
    drift = np.exp(drift_sigma * x - drift_sigma**2 / 2)
    ctx = 2048 + np.arange(steps)
    rows = []
    for t in range(steps):
        fresh = ctx[t] % BLOCK == 5
        for layer in range(layers):
            missing = rng.poisson(rate * drift[t]) + (rng.random() < fresh_frac if fresh else 0)
            rows.append((layer, t, int(ctx[t]), 0.1, missing))
    return pd.DataFrame(rows, columns=["layer", "step", "context_tokens", "change_frac", "missing_blocks"])


@pytest.mark.parametrize(("drift_sigma", "fresh_frac"), [(0.2, 0.8), (0.5, 0.3)])
def test_structure_fit_recovers_drift_and_fresh_block_misses(drift_sigma, fresh_frac):
    fit = fit_structure(_table(np.random.default_rng(0), drift_sigma, fresh_frac), BLOCK)
    assert fit["drift_sigma"] == pytest.approx(drift_sigma, abs=0.08)
    assert fit["fresh_block_frac"] == pytest.approx(fresh_frac, abs=0.15)
    assert fit["burst_prob"] < 0.02  # no topic shifts in the table (a lognormal drift rarely crosses 3×)


def test_structure_fit_needs_steps_after_the_working_set():
    with pytest.raises(ValueError, match="need >= 3 steps"):
        fit_structure(_table(np.random.default_rng(0), 0.2, 0.5, steps=14), BLOCK)


@pytest.mark.parametrize("sigma", [0.3, 0.7])
def test_layer_sigma_reproduces_the_cv_of_per_layer_misses(sigma):
    """Misses = change × a factor correlated with the change (layers that change more miss a larger share): the
    fitted lognormal spread, drawn independently over the same change curve, gives the measured CV back."""
    rng = np.random.default_rng(1)
    change = rng.uniform(0.05, 0.25, 4000)
    factor = np.exp(sigma * rng.standard_normal(4000)) * (change / change.mean()) ** 0.5  # correlated with change
    misses = change * factor
    fitted = layer_sigma(misses, change)
    redrawn = change * np.exp(fitted * rng.standard_normal(4000))
    assert np.std(redrawn) / np.mean(redrawn) == pytest.approx(np.std(misses) / np.mean(misses), rel=0.08)
    # the log-sd of misses / change misses the correlation and falls short
    assert np.std(np.log(misses / change)) < fitted


def _model(**stats):
    model = ModelSpec.model_validate(load_card("model", "qwen3-14b"))
    link = LinkModel(HardwareSpec.model_validate(load_card("hardware", "h200")))
    return RecallModel(model, OffloadPolicy(recall_buffer_blocks=64), RecallStatsSpec(**stats), link)


def test_per_request_factors_persist_across_steps():
    rec = _model(request_sigma=1.0, layer_sigma=0.0, drift_sigma=0.0, burst_prob=0.0)
    rng = np.random.default_rng(0)
    n = 400
    state = np.zeros((n, rec.state_width))
    selected = np.full(n, 64)
    recall_step.miss_frac(rec, selected, np.ones(n, dtype=bool), rng, state)  # join: factors drawn
    warm = np.zeros(n, dtype=bool)
    a = recall_step.miss_frac(rec, selected, warm, rng, state).mean(axis=1)
    b = recall_step.miss_frac(rec, selected, warm, rng, state).mean(axis=1)
    assert np.corrcoef(a, b)[0, 1] > 0.8  # a request that changes much keeps changing much


def test_independent_draws_do_not_persist():
    rec = _model(request_sigma=0.0, layer_sigma=0.0, drift_sigma=0.0, burst_prob=0.0)
    assert not rec.structured
    rng = np.random.default_rng(0)
    selected, warm = np.full(400, 64), np.zeros(400, dtype=bool)
    a = recall_step.miss_frac(rec, selected, warm, rng).mean(axis=1)
    b = recall_step.miss_frac(rec, selected, warm, rng).mean(axis=1)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.2


def test_topic_shift_raises_every_layer_of_the_request():
    rec = _model(request_sigma=0.0, layer_sigma=0.0, drift_sigma=0.0, burst_prob=1.0, burst_change_frac=0.9)
    rng = np.random.default_rng(0)
    state = np.zeros((10, rec.state_width))
    q = recall_step.miss_frac(rec, np.full(10, 64), np.zeros(10, dtype=bool), rng, state)
    assert (q >= 0.9).all()


def test_a_block_leaving_the_window_misses_where_layers_select_it():
    rec = _model(fresh_block_frac=1.0)
    ctx = np.array([rec.window_tokens + 10 * rec.block_size, rec.window_tokens + 10 * rec.block_size + 3])
    fresh = recall_step.fresh_misses(rec, ctx, np.zeros(2, dtype=bool), np.random.default_rng(0))
    assert (fresh[0] == rec.heads).all() and (fresh[1] == 0).all()

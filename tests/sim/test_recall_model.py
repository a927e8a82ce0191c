"""The recall model (sim/step/recall.py): budgets, windows, fragments, per-layer variation, draws."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config import HardwareSpec, ModelSpec, OffloadPolicy, RecallStatsSpec
from sim.config.loader import load_card, load_scenario
from sim.step.distributions import kumaraswamy_b
from sim.step.link import LinkModel
from sim.step.recall import RecallModel
from tests.sim.oracles import recall_step

MODEL = ModelSpec.model_validate(load_card("model", "qwen3-14b"))
LINK = LinkModel(HardwareSpec.model_validate(load_card("hardware", "h200")))


def _model(**policy) -> RecallModel:
    return RecallModel(MODEL, OffloadPolicy(**policy), RecallStatsSpec(), LINK)


@pytest.mark.parametrize("selection", ["solohead", "headwise"])
def test_recall_never_exceeds_the_budget(selection):
    rec = _model(selection=selection, block_size=16, recall_buffer_blocks=256)
    rng = np.random.default_rng(0)
    ctx = rng.integers(1, 100_000, size=300)
    cold = rng.random(300) < 0.3
    heads = MODEL.num_kv_heads if selection == "headwise" else 1
    selected = rec.selected_blocks(ctx)
    assert (selected <= 2048 // 16).all()
    q = recall_step.miss_frac(rec, selected, cold, rng)
    assert ((0 <= q) & (q <= 1)).all()
    step = recall_step.step(rec, ctx, cold, rng)
    assert (step.fragments <= int(selected.sum()) * heads).all()
    assert (step.nbytes == step.fragments * rec.fragment_bytes).all()


def test_no_recall_when_context_fits_in_sink_and_window():
    rec = _model()
    ctx = np.array([1, 300, 128 + 512, 128 + 512 + 31])  # never a whole block outside sink + window
    step = recall_step.step(rec, ctx, np.ones(4, dtype=bool), np.random.default_rng(0))
    assert step.nbytes.sum() == 0 and step.fragments.sum() == 0


def test_cold_request_recalls_its_whole_selection():
    rec = _model(miss_frac=None)
    step = recall_step.step(rec, np.array([50_000]), np.array([True]), np.random.default_rng(0))
    assert (step.fragments == 2048 // 32).all()


def test_headwise_moves_the_same_bytes_in_num_kv_heads_times_the_fragments():
    ctx, cold = np.array([40_000, 60_000]), np.array([True, True])
    solo = recall_step.step(_model(selection="solohead"), ctx, cold, np.random.default_rng(0))
    head = recall_step.step(_model(selection="headwise"), ctx, cold, np.random.default_rng(0))
    assert (head.nbytes == solo.nbytes).all()
    assert (head.fragments == MODEL.num_kv_heads * solo.fragments).all()
    assert _model(selection="headwise").fragment_bytes == 32 * MODEL.head_dim * 2 * 2


def test_full_offload_moves_every_offloaded_block_as_one_fragment_per_request():
    rec = _model(selection="all", io="per_fragment")
    ctx = np.array([10_000, 30_000])
    step = recall_step.step(rec, ctx, np.array([False, False]), np.random.default_rng(0))
    blocks = (ctx - 640) // 32
    assert (step.nbytes == blocks.sum() * rec.block_bytes_layer).all()
    assert (step.fragments == 2).all()


def test_gather_scatter_is_one_transfer_per_layer_and_per_fragment_one_per_fragment():
    from sim.policies import make_policy

    scn = load_scenario("default", ["policies=pulseinfer", "policy.pulseinfer.scheduling=sequential"])
    ctx, off, cold = np.array([40_000]), np.array([True]), np.array([True])
    gs = make_policy(scn, "pulseinfer").step_cost(ctx, off, cold, np.random.default_rng(0))
    scn = load_scenario("default", ["policies=pulseinfer", "policy.pulseinfer.scheduling=sequential",
                                    "policy.pulseinfer.io=per_fragment"])  # fmt: skip
    pf = make_policy(scn, "pulseinfer").step_cost(ctx, off, cold, np.random.default_rng(0))
    assert gs.num_transfers == MODEL.num_layers
    assert pf.num_transfers == pf.num_fragments == gs.num_fragments
    assert all(g > 0 for g in gs.gather_s) and pf.gather_s is None
    assert sum(pf.recall_s) > sum(gs.recall_s)  # 16-token SoloHead blocks: per-copy latency adds up


EARLY_HEAVY = [(0.0, 0.30), (0.1, 0.22), (1.0, 0.16)]  # a depth profile in which early layers change more


def test_change_draws_follow_the_per_layer_means():
    stats = RecallStatsSpec(change_mean_by_depth=EARLY_HEAVY)
    rec = RecallModel(MODEL, OffloadPolicy(recall_buffer_blocks=64, budget_tokens=2048), stats, LINK)
    # buffer == selection: no returning block can hit, so the miss fraction is the change fraction
    q = recall_step.miss_frac(rec, np.full(4000, 64), np.zeros(4000, dtype=bool), np.random.default_rng(1))
    assert q.mean(axis=0) == pytest.approx(rec.change_mean, abs=0.01)
    assert q[:, 0].mean() > q[:, -1].mean() + 0.1  # early layers change more (this depth profile)


@pytest.mark.parametrize(("mean", "a"), [(0.1, 1.0), (0.2, 2.0), (0.5, 3.0)])
def test_kumaraswamy_b_gives_the_requested_mean(mean, a):
    b = kumaraswamy_b(mean, a)
    u = np.random.default_rng(0).random(200_000)
    x = (1 - (1 - u) ** (1 / b)) ** (1 / a)
    assert x.mean() == pytest.approx(mean, abs=0.003)


def test_kumaraswamy_b_stops_at_the_bisection_fixed_point():
    """Stopping the bisection once it stops moving gives what all 200 halvings give, bit for bit."""
    from math import lgamma

    def full_bisection(mean: float, a: float) -> float:
        def mean_of(b: float) -> float:
            return float(np.exp(np.log(b) + lgamma(1 + 1 / a) + lgamma(b) - lgamma(1 + 1 / a + b)))

        lo, hi = 1e-6, 1e6
        for _ in range(200):
            mid = (lo * hi) ** 0.5
            lo, hi = (mid, hi) if mean_of(mid) > mean else (lo, mid)
        return (lo * hi) ** 0.5

    rng = np.random.default_rng(11)
    for mean, a in zip(rng.uniform(0.001, 0.99, 300).tolist(), rng.uniform(0.2, 5.0, 300).tolist()):
        assert kumaraswamy_b(mean, a) == full_bisection(mean, a), (mean, a)


def test_layers_table_shows_more_recall_in_early_layers():
    profile = "[" + ",".join(f"[{d},{m}]" for d, m in EARLY_HEAVY) + "]"
    overrides = ["workload.max_requests=150", "policies=pulseinfer", "run.progress=false"]
    scn = load_scenario("default", [*overrides, f"recall_stats.change_mean_by_depth={profile}"])
    from sim.run import simulate

    layers = simulate(scn).policies["pulseinfer"].layers
    assert len(layers) == MODEL.num_layers
    first, last = layers["recall_bytes"].iloc[:4].mean(), layers["recall_bytes"].iloc[-4:].mean()
    assert first > 1.2 * last

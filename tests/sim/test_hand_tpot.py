"""A one-request scenario whose TTFT and TPOT are computed by hand from the documented formulas
(sim/step/compute.py, sim/step/recall.py, sim/step/pipeline.py docstrings), independently of the simulator's code."""

from __future__ import annotations

import math

import pytest

from sim.run import simulate

PROMPT, OUTPUT = 20000, 50  # tokens of the one request


def _hand_model(scn):
    m, hw = scn.model, scn.hardware
    bw = hw.hbm_bandwidth_gbps * 1e9 * hw.hbm_efficiency
    flops = hw.bf16_tflops * 1e12 * hw.prefill_mfu  # a BF16 model: GEMMs at the BF16 peak times their efficiency
    attn_flops = hw.bf16_tflops * 1e12 * (hw.attn_mfu or hw.prefill_mfu)  # attention at its own
    pass_s = hw.prefill_act_passes * m.hidden_size * 2 / bw  # a prefill token's memory-bound passes in one layer
    half = hw.hbm_half_bytes  # each kernel reads this much more (its size-dependent efficiency)
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    layer_params = 2 * m.hidden_size * q + 2 * m.hidden_size * kv + 3 * m.hidden_size * m.intermediate_size
    kv_layer = 2 * kv * 2  # bf16 K and V of one token in one layer
    lm = m.vocab_size * m.hidden_size
    weights = (m.num_layers * layer_params + 2 * lm) * 2

    def layer_s(attended: int) -> float:  # batch of one: 4 weight GEMMs, then attention over one request
        gemm = max((layer_params * 2 + 4 * half) / bw, 2 * layer_params / flops)
        tiles = m.num_kv_heads * math.ceil(attended / 256)  # split-KV: one tile per 256-token chunk and KV head
        fill = tiles / (tiles + hw.attn_half_tiles * hw.sm_count)
        attn = max(
            kv_layer * (attended + hw.attn_half_tokens) / (bw * hw.attn_efficiency * fill),
            4 * q * attended / attn_flops,
        )
        return gemm + attn

    head_s = max((lm * 2 + half) / bw, 2 * lm / flops) + hw.decode_request_overhead_us * 1e-6

    def prefill_s(new: int, cached: int, completing: int) -> float:
        gemm = (2 * new * m.num_layers * layer_params + completing * 2 * lm) / flops
        attn = 4 * q * m.num_layers * (new * cached + new * (new + 1) / 2) / attn_flops
        return max(gemm + attn + new * m.num_layers * pass_s, weights / bw)

    ttft = prefill_s(8192, 0, 0) + prefill_s(8192, 8192, 0) + prefill_s(PROMPT - 16384, 16384, 1)
    return layer_s, head_s, ttft, hw.decode_step_overhead_us * 1e-6


def _run(scn):
    res = simulate(scn)
    return {name: r.requests.iloc[0] for name, r in res.policies.items()}


def test_sglang_tpot_matches_hand_computation(one_request_scenario):
    scn = one_request_scenario(PROMPT, OUTPUT, "policies=sglang")
    layer_s, head_s, ttft, overhead = _hand_model(scn)
    L = scn.model.num_layers
    steps = [overhead + L * layer_s(PROMPT + k) + head_s for k in range(1, OUTPUT)]
    row = _run(scn)["sglang"]
    assert row.ttft_s == pytest.approx(ttft, rel=1e-12)
    assert row.tpot_s == pytest.approx(sum(steps) / (OUTPUT - 1), rel=1e-12)


@pytest.mark.parametrize("io", ["gather_scatter", "per_fragment"])
@pytest.mark.parametrize("h2d_gbps", [55.0, 5.0], ids=["compute_bound", "link_bound"])
def test_pulseinfer_tpot_matches_hand_computation(one_request_scenario, h2d_gbps, io):
    scn = one_request_scenario(
        PROMPT,
        OUTPUT,
        "policies=pulseinfer",
        "policy.pulseinfer.miss_frac=1.0",
        f"policy.pulseinfer.io={io}",
        "policy.pulseinfer.scheduling=sequential",  # the one-layer look-ahead pipeline, by hand
        "policy.pulseinfer.admission=static",
        f"hardware.h2d_bandwidth_gbps={h2d_gbps}",
        "hardware.d2h_coupling=0",
    )
    p, hw = scn.policy["pulseinfer"], scn.hardware
    layer_s, head_s, ttft, overhead = _hand_model(scn)
    L = scn.model.num_layers
    kv_layer = 2 * scn.model.num_kv_heads * scn.model.head_dim * 2
    t0 = hw.h2d_latency_us * 1e-6
    steps = []
    for k in range(1, OUTPUT):
        ctx = PROMPT + k
        attended = p.sink_tokens + p.recent_tokens + p.budget_tokens + math.ceil(ctx / p.block_size)
        c = layer_s(attended) + p.eager_launch_us_per_layer * 1e-6  # a step that recalls runs its layers eagerly
        selected = min(p.budget_tokens // p.block_size, (ctx - p.sink_tokens - p.recent_tokens) // p.block_size)
        nbytes = selected * p.block_size * kv_layer  # SoloHead: one fragment per block, every head
        if io == "gather_scatter":  # host gather of every fragment, then one copy (sim/step/link.py)
            gather = selected * hw.host_gather_fragment_us * 1e-6 + nbytes / (hw.host_gather_gbps_per_thread * 1e9)
            r = gather / hw.host_gather_threads + t0 + nbytes / (h2d_gbps * 1e9)
        else:  # one copy per block, each at least one call's host cost
            r = selected * max(hw.h2d_call_us * 1e-6, t0 + nbytes / selected / (h2d_gbps * 1e9))
        # one-layer look-ahead: recall l+1 overlaps compute l (sim/step/pipeline.py)
        body = r + L * c if r <= c else L * r + c
        steps.append(overhead + body + head_s)
    row = _run(scn)["pulseinfer"]
    assert bool(row.offloaded)
    assert row.ttft_s == pytest.approx(ttft, rel=1e-12)
    assert row.tpot_s == pytest.approx(sum(steps) / (OUTPUT - 1), rel=1e-9)


def test_link_bound_regime_is_really_link_bound(one_request_scenario):
    """Guards the parametrisation above: at 5 GB/s a layer's recall outlasts its compute."""
    full = ("policies=pulseinfer", "policy.pulseinfer.miss_frac=1.0", "policy.pulseinfer.admission=static")
    fast = _run(one_request_scenario(PROMPT, OUTPUT, *full, "hardware.h2d_bandwidth_gbps=55"))
    slow = _run(one_request_scenario(PROMPT, OUTPUT, *full, "hardware.h2d_bandwidth_gbps=5"))
    assert slow["pulseinfer"].tpot_s > 2 * fast["pulseinfer"].tpot_s


def test_short_prompt_stays_dense_under_pulseinfer(one_request_scenario):
    scn = one_request_scenario(4000, 20, "policies=sglang,pulseinfer", "policy.pulseinfer.micro_batches=1")
    rows = _run(scn)
    assert not bool(rows["pulseinfer"].offloaded)
    assert rows["pulseinfer"].tpot_s == pytest.approx(rows["sglang"].tpot_s, rel=1e-12)

"""Fits recover known parameters from synthetic tables made with them (plus seeded multiplicative noise)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from calibrate.fit import (
    fit_compute,
    fit_gather,
    fit_gpu_gather,
    fit_link,
    fit_relative_nonneg,
    fit_selection,
    table_copy_s,
)

NOISE = 0.02  # ±2 % per sample; fits take the fastest of 5 repeats


def _noisy(rng: np.random.Generator, value: float, repeats: int = 5) -> list[float]:
    return list(value * (1 + rng.uniform(-NOISE, NOISE, repeats)))


def test_relative_nonneg_exact_and_clamped():
    x = np.column_stack([np.ones(5), np.arange(1, 6)])
    fit = fit_relative_nonneg(x, 2.0 + 3.0 * np.arange(1, 6))
    assert fit.coef == pytest.approx((2.0, 3.0))
    assert fit.mape_pct == pytest.approx(0.0, abs=1e-9)
    # data with a negative intercept: the intercept is clamped to 0, never negative
    clamped = fit_relative_nonneg(x, -0.5 + 3.0 * np.arange(1, 6))
    assert clamped.coef[0] == 0.0 and clamped.coef[1] > 0
    with pytest.raises(ValueError, match="positive"):
        fit_relative_nonneg(x, np.array([1.0, 0.0, 1.0, 1.0, 1.0]))


def test_fit_link_recovers_latency_and_bandwidth():
    rng = np.random.default_rng(0)
    t0_s, bps = 8e-6, 12e9
    rows = [
        (size, r, s) for size in (4096 * 2**i for i in range(15)) for r, s in enumerate(_noisy(rng, t0_s + size / bps))
    ]
    link = fit_link(pd.DataFrame(rows, columns=["size_bytes", "repeat", "seconds"]))
    assert link.latency_us == pytest.approx(8.0, rel=0.05)
    assert link.bandwidth_gbps == pytest.approx(12.0, rel=0.05)
    assert link.mape_pct < 2 * NOISE * 100
    sizes = [s for s, _ in link.size_table]
    assert sizes == sorted(sizes) and len(sizes) == 15
    # the table reproduces each fastest copy time
    assert table_copy_s(link.size_table, np.array([65536.0]))[0] == pytest.approx(t0_s + 65536 / bps, rel=NOISE)


def test_fit_gather_recovers_fragment_cost_and_rate():
    rng = np.random.default_rng(1)
    table = [(4096 * 4**i, 2.0 + i) for i in range(8)]  # any copy table: the fit subtracts it
    frag_s, gather_bps = 1.5e-6, 4e9
    rows = []
    for frag in (8192, 32768, 131072):
        for n in (16, 128, 512):
            nbytes = n * frag
            truth = table_copy_s(table, np.array([nbytes]))[0] + n * frag_s + nbytes / gather_bps
            rows += [("gather_scatter", frag, n, nbytes, r, s) for r, s in enumerate(_noisy(rng, truth))]
            rows += [("per_fragment", frag, n, nbytes, r, s) for r, s in enumerate(_noisy(rng, 3 * truth))]
    recall = pd.DataFrame(
        rows, columns=["mode", "fragment_bytes", "num_fragments", "recall_bytes", "repeat", "seconds"]
    )
    gather = fit_gather(recall, table)
    assert gather.fragment_us == pytest.approx(1.5, rel=0.1)
    assert gather.gbps == pytest.approx(4.0, rel=0.1)
    assert gather.mape_pct < 2 * NOISE * 100


def test_fit_compute_recovers_layer_and_head_terms():
    rng = np.random.default_rng(2)
    base, per_req, per_tok = 2e-3, 150e-6, 400e-9
    head_base, head_req = 900e-6, 60e-6
    rows = []
    for b in (1, 2, 4, 8, 16):
        for ctx in (512, 2048, 8192):
            t = b * ctx
            layer = base + per_req * b + per_tok * t
            for r, (ls, hs) in enumerate(zip(_noisy(rng, layer), _noisy(rng, head_base + head_req * b))):
                rows.append((b, ctx, t, r, ls, hs))
    df = pd.DataFrame(rows, columns=["batch_size", "context_tokens", "attended_tokens", "repeat", "layer_s", "head_s"])
    prof = fit_compute(df, "tiny")
    assert prof.model == "tiny"
    assert prof.layer_base_us == pytest.approx(2000, rel=0.1)
    assert prof.layer_per_request_us == pytest.approx(150, rel=0.25)
    assert prof.layer_per_token_ns == pytest.approx(400, rel=0.05)
    assert prof.head_base_us == pytest.approx(900, rel=0.1)
    assert prof.head_per_request_us == pytest.approx(60, rel=0.2)
    assert prof.mape_pct < 2 * NOISE * 100 and prof.points == 15


def test_fit_selection_recovers_base_and_per_block():
    rng = np.random.default_rng(3)
    rows = [
        (b, c, r, s)
        for b, c in ((1, 120), (1, 1016), (8, 960), (8, 8128), (16, 16256))
        for r, s in enumerate(_noisy(rng, 300e-6 + 80e-9 * c))
    ]
    sel = fit_selection(pd.DataFrame(rows, columns=["batch_size", "candidate_blocks", "repeat", "seconds"]))
    assert sel.base_us == pytest.approx(300, rel=0.1)
    assert sel.per_block_ns == pytest.approx(80, rel=0.05)


def test_fits_refuse_too_few_points():
    with pytest.raises(ValueError, match="two sizes"):
        fit_link(pd.DataFrame({"size_bytes": [4096, 4096], "repeat": [0, 1], "seconds": [1e-6, 1e-6]}))
    with pytest.raises(ValueError, match="three"):
        fit_compute(
            pd.DataFrame(
                {
                    "batch_size": [1],
                    "context_tokens": [8],
                    "attended_tokens": [8],
                    "repeat": [0],
                    "layer_s": [1.0],
                    "head_s": [1.0],
                }
            ),
            "m",
        )


def test_fit_gpu_gather_recovers_launch_rate_and_half_size():
    rng = np.random.default_rng(5)
    launch_s, bps, half = 6e-6, 30e9, 256.0
    rows = []
    for frag in (1024, 8192, 65536):
        for n in (64, 512, 4096):
            truth = launch_s + (n * frag + n * half) / bps
            rows += [("gpu_gather", frag, n, n * frag, r, s) for r, s in enumerate(_noisy(rng, truth))]
            rows += [("per_fragment", frag, n, n * frag, r, s) for r, s in enumerate(_noisy(rng, 5 * truth))]
    recall = pd.DataFrame(
        rows, columns=["mode", "fragment_bytes", "num_fragments", "recall_bytes", "repeat", "seconds"]
    )
    gg = fit_gpu_gather(recall)
    assert gg.launch_us == pytest.approx(6.0, rel=0.15)
    assert gg.gbps == pytest.approx(30.0, rel=0.05)
    assert gg.half_bytes == pytest.approx(256.0, rel=0.15)
    assert fit_gpu_gather(recall[recall["mode"] != "gpu_gather"]) is None  # a CPU calibration measures none

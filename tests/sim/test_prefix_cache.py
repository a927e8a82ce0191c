"""Radix prefix cache (sim/serving/prefix.py): shared blocks held once, reference counts, LRU eviction, and its
effect on the simulator (hit fraction against an unbounded cache, colocated prefill work)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import load_scenario
from sim.policies import make_policy
from sim.run import simulate, simulate_policy
from sim.serving.kv import KvState
from sim.serving.prefix import PrefixCache, reload_forward_s
from sim.serving.request import Request
from sim.step.link import LinkModel
from sim.workload import load_workload
from tests.sim.oracles import link as link_oracle
from tests.sim.oracles.prefix import unbounded_hit_tokens

BT = 512  # Mooncake's tokens per hash block


def _req(rid: int, ids: list[int], prompt: int) -> Request:
    r = Request(rid, 0.0, prompt, 10)
    r.hash_ids, r.hash_block_tokens = tuple(ids), BT
    return r


def _admit(kv: KvState, req: Request, now: float) -> int:
    path, hit, added = kv.prefix.acquire(req.hash_ids, req.prompt_tokens, BT, now)
    assert kv.device.allocate(added)
    req.prefix_path, req.shared_blocks = path, sum(n.blocks for n in path)
    kv.hold(req, req.prompt_tokens, 0)
    return hit


def test_shared_blocks_are_counted_once_and_freed_with_the_last_reference():
    kv = KvState(100_000, 0, 1, 0, PrefixCache(1))
    a, b = _req(0, [7, 8, 9], 1200), _req(1, [7, 8, 5], 1100)  # share two 512-token blocks
    assert _admit(kv, a, 0.0) == 0
    assert _admit(kv, b, 1.0) == 1024
    # a's chain 512 + 512 + 176, b's own third block 76: the shared 1024 tokens once
    assert kv.prefix.cached_blocks == 1200 + 76
    assert kv.device.used == 1200 + 76
    kv.release(a)
    assert kv.prefix.evictable_blocks == 176  # a's tail block; the shared two are still b's
    assert kv.prefix.evict(10**9) == 176
    kv.release(b)
    assert kv.prefix.evictable_blocks == 1024 + 76
    assert kv.prefix.evict(10**9) == 1024 + 76
    kv.device.release(1024 + 76 + 176)  # what make_room gives back after evict
    assert kv.device.used == 0 and not kv.prefix.nodes


def test_warm_prefixes_are_cached_unreferenced_and_the_earliest_give_way_when_the_pool_is_short():
    """KvState.warm (a measured server's cache before its run): chains in order, the last most recently used; a
    chain that does not fit evicts earlier ones; the pool's count always equals the cache's."""
    kv = KvState(2 * BT + 100, 0, 1, 0, PrefixCache(1))
    assert kv.warm([((1, 2), 2 * BT), ((3,), BT)], BT) == 2  # the second evicts the first's leaf
    assert kv.device.used == kv.prefix.cached_blocks == kv.prefix.evictable_blocks <= 2 * BT + 100
    assert kv.prefix.match((3,), BT + 1, BT)[1] == BT  # the latest is whole
    assert kv.warm([((9,) * 5, 5 * BT)], BT) == 0  # larger than the pool: left out, nothing changed
    assert kv.device.used == kv.prefix.cached_blocks
    assert KvState(100, 0, 1, 0, None).warm([((1,), BT)], BT) == 0  # no prefix cache: nothing to warm


def test_eviction_is_least_recently_used_first():
    cache = PrefixCache(1)
    for t, ids in enumerate(([1], [2], [3])):
        path, _, _ = cache.acquire(ids, 512, BT, float(t))
        cache.release(path, float(t))
    path, _, _ = cache.acquire([1], 512, BT, 5.0)  # [1] used again: now the newest
    cache.release(path, 5.0)
    cache.evict(512)
    assert sorted(k[1] for k in cache.nodes) == [1, 3]


def test_a_parent_is_evicted_only_after_its_children():
    cache = PrefixCache(1)
    path, _, _ = cache.acquire([1, 2], 1024, BT, 0.0)
    cache.release(path, 0.0)
    assert cache.evict(1) == 512
    assert [k[1] for k in cache.nodes] == [1]


def test_hit_leaves_the_last_prompt_token_to_compute():
    cache = PrefixCache(1)
    cache.acquire([1, 2], 1024, BT, 0.0)
    _, hit = cache.match([1, 2], 1024, BT)
    assert hit == 1023


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 4), min_size=1, max_size=4), st.booleans()), max_size=25))
def test_evictable_and_cached_counters_match_a_recount(ops):
    cache, live = PrefixCache(1), []
    for t, (ids, release_one) in enumerate(ops):
        path, _, _ = cache.acquire(ids, 512 * len(ids), BT, float(t))
        live.append(path)
        if release_one and live:
            cache.release(live.pop(0), float(t))
        if t % 3 == 0:
            cache.evict(700)
        assert cache.cached_blocks == sum(n.blocks for n in cache.nodes.values())
        assert cache.evictable_blocks == sum(n.blocks for n in cache.nodes.values() if n.refs == 0)


def _colocated(n: int, *overrides: str):
    base = ["serving.prefill=colocated", "policies=sglang", "run.progress=false", "run.debug_checks=true"]
    return load_scenario("default", [*base, f"workload.max_requests={n}", "workload.time_scale=1", *overrides])


def test_mooncake_slice_keeps_hash_ids_and_their_block_size():
    df = load_workload(_colocated(20))
    assert "hash_ids" in df.columns and df.attrs["hash_block_tokens"] == BT
    assert all(len(ids) == -(-p // BT) for ids, p in zip(df["hash_ids"], df["prompt_tokens"]))


def test_with_room_for_everything_the_hit_fraction_is_what_hash_ids_allow():
    scn = _colocated(150, "hardware.hbm_gib=4000")
    df = load_workload(scn)
    hits = unbounded_hit_tokens(df["hash_ids"], df["prompt_tokens"], BT)
    res = simulate(scn).policies["sglang"]
    assert res.summary["prefix_hit_frac"] == pytest.approx(sum(hits) / df["prompt_tokens"].sum(), rel=1e-12)
    assert np.array_equal(res.requests["prefix_hit_tokens"].to_numpy(), np.asarray(hits))


def test_colocated_prefill_skips_the_hit_tokens():
    on = simulate(_colocated(150, "hardware.hbm_gib=4000")).policies["sglang"]
    off = simulate(_colocated(150, "hardware.hbm_gib=4000", "policy.sglang.prefix_cache=false")).policies["sglang"]
    hits = int(on.requests["prefix_hit_tokens"].sum())
    assert hits > 0 and off.summary["prefix_hit_frac"] == 0
    prefill = {k: r.steps.loc[r.steps["phase"] == "prefill"] for k, r in (("on", on), ("off", off))}
    assert prefill["off"]["prefill_tokens"].sum() - prefill["on"]["prefill_tokens"].sum() == hits
    assert prefill["on"]["duration_s"].sum() < prefill["off"]["duration_s"].sum()


def test_under_memory_pressure_the_cache_hits_no_more_than_unbounded():
    scn = _colocated(150)
    df = load_workload(scn)
    bound = sum(unbounded_hit_tokens(df["hash_ids"], df["prompt_tokens"], BT)) / df["prompt_tokens"].sum()
    assert 0 < simulate(scn).policies["sglang"].summary["prefix_hit_frac"] <= bound


def test_hicache_keeps_evicted_nodes_on_host_and_reloads_them():
    cache = PrefixCache(1, host_tier=True)
    path, _, _ = cache.acquire([1, 2], 1024, BT, 0.0)
    cache.release(path, 0.0)
    assert cache.evict(10**9) == 1024 and cache.host_blocks == 1024 and cache.cached_blocks == 0
    path, hit, added = cache.acquire([1, 2, 3], 1200, BT, 1.0)
    assert hit == 1024 and cache.reloaded_tokens == 1024 and added == 1024 + 176
    assert cache.host_blocks == 0 and all(n.on_device for n in path)


def test_reload_link_time_by_hand():
    # One 3-block hit (1536 tokens) of Qwen3-14B from host over the H200's link, hidden layer-wise behind a
    # longer prefill forward except the first layer's share.
    load_s = 1536 * 163840 / 55e9  # tokens × KV bytes per token / H2D bytes per second
    assert reload_forward_s(0.5, load_s, 40) == pytest.approx(0.5 + load_s / 40, rel=1e-12)
    assert reload_forward_s(1e-3, load_s, 40) == pytest.approx(load_s * (1 + 1 / 40), rel=1e-12)


def test_replica_charges_a_reload_in_the_prefill_forward():
    # Two requests with the same 3-block prefix, far apart; a tiny pool makes the first one's prefix leave the
    # device before the second arrives, so HiCache reloads it and plain SGLang recomputes it.
    rows = [(0.0, 1600, 2, [1, 2, 3, 4]), (1.0, 1700, 2, [9]), (100.0, 1600, 2, [1, 2, 3, 5])]
    df = pd.DataFrame(
        {
            "request_id": range(3),
            "arrival_s": [r[0] for r in rows],
            "prompt_tokens": [r[1] for r in rows],
            "output_tokens": [r[2] for r in rows],
            "hash_ids": [r[3] for r in rows],
        }
    )
    df.attrs["hash_block_tokens"] = BT

    scn = _colocated(3, "policies=sglang,sglang_hicache")
    pool_tokens = 2000  # room for one request at a time
    hw = scn.hardware
    gib = (pool_tokens * scn.model.kv_bytes_per_token + scn.model.weight_bytes) / 2**30 + hw.reserve_gib
    scn = _colocated(
        3, "policies=sglang,sglang_hicache", f"hardware.hbm_gib={gib}", f"hardware.reserve_gib={hw.reserve_gib}"
    )
    plain, hicache = (simulate_policy(scn, df, p).steps for p in ("sglang", "sglang_hicache"))
    last = {k: s[s["phase"] == "prefill"].iloc[-1] for k, s in (("plain", plain), ("hicache", hicache))}
    assert last["plain"]["prefill_tokens"] == 1600 and last["hicache"]["prefill_tokens"] == 1600 - 1536
    pol = make_policy(scn, "sglang_hicache")
    compute_s = pol.compute.prefill_s([(1600 - 1536, 1536)], 1)
    # the load: one copy per layer on the link (LinkModel: latency included), the link idle before it
    layers = scn.model.num_layers
    load_s = layers * link_oracle.transfer_s(LinkModel(hw), 1536 * scn.model.kv_bytes_per_token / layers)
    assert load_s > 1536 * scn.model.kv_bytes_per_token / (hw.h2d_bandwidth_gbps * 1e9)
    expected = max(compute_s, load_s) + load_s / layers
    assert last["hicache"]["duration_s"] == pytest.approx(expected, rel=1e-9)


def test_hicache_runs_on_agentic_sessions():
    scn = load_scenario(
        "agentic",
        ["serving.prefill=colocated", "policies=sglang,sglang_hicache", "workload.sessions.max_sessions=3",
         "run.progress=false", "run.debug_checks=true"],
    )  # fmt: skip
    res = simulate(scn).policies
    assert res["sglang_hicache"].summary["unfinished"] == 0
    assert res["sglang_hicache"].summary["prefix_hit_frac"] >= res["sglang"].summary["prefix_hit_frac"] > 0

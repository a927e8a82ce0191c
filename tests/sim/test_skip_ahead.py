"""Skip-ahead (``run.skip_ahead``, sim/serving/replica.py ``Replica._decode_run``) equals stepping one decode step
at a time: every table and the summary, bit for bit, over whole runs that exercise what can end or forbid a run
(arrivals, finishes, chunked prefill, preemption, prefix-cache eviction, offloaded requests, remote prefill,
closed-loop sessions, several replicas, a horizon); and the vectorised layer time equals the scalar one.
Each run also checks that skip-ahead did run (else the comparison would prove nothing)."""

from __future__ import annotations

from collections import deque

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import load_scenario
from sim.config.parallel import per_gpu_hardware, shard_model
from sim.policies import make_policy
from sim.run import simulate
from sim.serving.cluster import simulate_cluster
from sim.serving.kv import KvState
from sim.serving.policy_admission import admission_of
from sim.serving.prefix import PrefixCache
from sim.serving.replica import Replica
from sim.serving.request import DecodeBatch, Request
from sim.step.compute import ComputeModel
from sim.workload import load_workload

TABLES = ("steps", "requests", "layers", "layer_recall", "timeline")

SHORT = [
    "model=llama-3.1-8b", "hardware=h100-sxm", "workload.trace=azure_conv_2023", "workload.max_requests=150",
    "workload.max_prompt_tokens=3500", "workload.time_scale=1", "workload.target_rate_per_s=4",
    "serving.prefill=colocated", "run.progress=false", "run.debug_checks=true", "engine=sglang-0.4",
]  # fmt: skip
SMALL_POOL = [
    "hardware.hbm_gib=19.3",
    "workload.target_rate_per_s=20",
]  # ~1 GiB of KV (8B; SGLang 0.4 keeps 3.3 GiB below 35 GB)


@pytest.fixture
def counted(monkeypatch):
    """Counts the runs skip-ahead computed (``counted["runs"]``) and those begun with requests queued."""
    counts = {"runs": 0, "queued": 0}
    real = Replica._decode_run

    def run(self):
        queued = bool(self.waiting)
        done = yield from real(self)
        counts["runs"] += bool(done)
        counts["queued"] += bool(done) and queued
        return done

    monkeypatch.setattr(Replica, "_decode_run", run)
    return counts


def _both(overrides: list[str], scenario: str = "default"):
    """(reference result, skip-ahead result) of ``simulate`` on the same scenario and seed."""
    ref = simulate(load_scenario(scenario, [*overrides, "run.skip_ahead=false"]))
    fast = simulate(load_scenario(scenario, [*overrides, "run.skip_ahead=true"]))
    return ref, fast


def _assert_equal(ref, fast) -> None:
    assert ref.policies.keys() == fast.policies.keys()
    for name, a in ref.policies.items():
        b = fast.policies[name]
        for table in TABLES:
            if getattr(a, table) is None:
                assert getattr(b, table) is None
                continue
            pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table), check_exact=True, obj=f"{name} {table}")
        assert a.summary.keys() == b.summary.keys()
        for key, value in a.summary.items():
            other = b.summary[key]
            assert value == other or (value != value and other != other), (name, key, value, other)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(["policies=sglang,pulseinfer"], id="colocated"),
        # some requests offloaded: runs stop at them, recall steps interleave with skipped ones
        pytest.param(["policies=pulseinfer", "policy.pulseinfer.offload_threshold_tokens=1500"], id="mixed-offloaded"),
        pytest.param(["policies=sglang", "serving.prefill=disaggregated", "serving.num_prefill_gpus=2"], id="pd"),
        pytest.param(["policies=sglang", "serving.prefill=none"], id="prefill-none"),
        pytest.param(["policies=sglang", "policy.sglang.prefix_cache=true"], id="prefix-cache"),
        pytest.param(
            ["policies=sglang", "policy.sglang.decode_scheduler=sglang_pd", "serving.prefill=none"], id="pd-sched"
        ),
        # a small pool: decode growth preempts (recompute) — the step that would preempt runs the reference way
        pytest.param(["policies=sglang", *SMALL_POOL], id="preempting"),
        pytest.param(["policies=sglang", "run.horizon_s=20"], id="horizon"),
        # a pool so small that 5 of the 150 requests are rejected on arrival, in the middle of runs they pass
        pytest.param(["policies=sglang", "hardware.hbm_gib=18.5"], id="rejected-on-arrival"),
        pytest.param(["policies=sglang", "run.tables=summary"], id="summary-only"),
    ],
)
def test_tables_equal_with_and_without_skip_ahead(overrides, counted):
    ref, fast = _both([*SHORT, *overrides])
    assert counted["runs"] > 10, counted  # skip-ahead ran (the fixture counts only the skip-ahead side)
    _assert_equal(ref, fast)
    if "hardware.hbm_gib=18.5" in overrides:
        assert (fast.policies["sglang"].requests["unfinished_reason"] == "exceeds_kv_pool").sum() > 0
    if SMALL_POOL[0] in overrides:
        assert fast.policies["sglang"].summary["num_preemptions"] > 0
        assert counted["queued"] > 10, counted  # runs ended by a queued request's admission (quiet_decisions)


@pytest.mark.parametrize(
    "overrides",
    [
        # SGLang's PD decode admission with swap retraction (the shipped default's sglang), queue always full
        pytest.param(
            ["policies=sglang", "workload.max_requests=120", "workload.time_scale=0.5"], id="default-pd-admission"
        ),
        # colocated on the Mooncake slice: the radix cache matches queued prompts' hash_ids (cached blocks, room)
        pytest.param(["policies=sglang", "serving.prefill=colocated", "workload.max_requests=150"], id="prefix-hashes"),
        # IO-adaptive admission with dense-only heads, queue full (a small pool); and with offloadable heads
        pytest.param([*SHORT, "policies=pulseinfer", *SMALL_POOL], id="io-dense"),
        pytest.param(
            [*SHORT, "policies=pulseinfer", *SMALL_POOL, "policy.pulseinfer.offload_threshold_tokens=2000"],
            id="io-offloadable",
        ),
        # the memory-only rule with its ratio decaying through a run (colocated, static admission)
        pytest.param([*SHORT, "policies=headwise", *SMALL_POOL], id="static"),
    ],
)
def test_queued_requests_end_runs_where_they_would_join(overrides, counted):
    ref, fast = _both([*overrides, "run.progress=false", "run.debug_checks=true"])
    assert counted["queued"] > 10, counted
    _assert_equal(ref, fast)
    if overrides[:2] == ["policies=sglang", "serving.prefill=colocated"]:  # prefix-hashes
        assert fast.policies["sglang"].summary["prefix_hit_frac"] > 0  # the cache did match prompts


def test_tensor_parallel_70b_equal(counted):
    ref, fast = _both([*SHORT, "model=llama-3.1-70b", "serving.tp_size=2", "policies=sglang,pulseinfer"])
    assert counted["runs"] > 10
    _assert_equal(ref, fast)


def test_closed_loop_sessions_equal(counted):
    overrides = [
        "workload.sessions.max_sessions=6", "run.progress=false", "run.debug_checks=true", "policies=sglang",
        "serving.prefill=none",
    ]  # fmt: skip
    ref, fast = _both(overrides, "agentic")
    assert counted["runs"] > 10
    _assert_equal(ref, fast)


@pytest.mark.parametrize(
    "policy, replicas, router, extra",
    [
        pytest.param("sglang", 2, "least_tokens", [], id="least-tokens"),
        pytest.param("sglang", 4, "round_robin", ["workload.target_rate_per_s=12"], id="round-robin"),
        pytest.param("sglang", 3, "least_tokens", ["run.horizon_s=15"], id="horizon"),
        # offloaded runs behind a router; disaggregated fleets keep every event (remote prefills feed replicas)
        pytest.param(
            "pulseinfer", 3, "least_tokens", ["policy.pulseinfer.offload_threshold_tokens=16"], id="offloaded"
        ),
        # disaggregated: a replica's own remote prefills feed its queue between arrivals (one prefill GPU: they queue)
        pytest.param("sglang", 2, "round_robin", ["serving.prefill=disaggregated"], id="disaggregated"),
        pytest.param(
            "sglang",
            3,
            "least_tokens",
            ["serving.prefill=disaggregated", "serving.num_prefill_gpus=1", "workload.target_rate_per_s=15"],
            id="disaggregated-queued-prefill",
        ),
        pytest.param(
            "sglang",
            2,
            "round_robin",
            ["serving.prefill=disaggregated", *SMALL_POOL, "workload.target_rate_per_s=40"],
            id="pd-preempting",
        ),
        pytest.param(
            "pulseinfer",
            2,
            "least_tokens",
            ["serving.prefill=disaggregated", "policy.pulseinfer.offload_threshold_tokens=1500"],
            id="pd-offloaded",
        ),
        pytest.param("sglang", 3, "round_robin", ["serving.prefill=none"], id="prefill-none"),
    ],
)
def test_cluster_equal(counted, policy, replicas, router, extra):
    """Behind a router a replica's runs end only at arrivals and the horizon (other replicas' steps and finishes
    cannot change its decisions): every request row, the routing and the summary equal stepping's."""

    def run(skip: str):
        scenario = load_scenario("default", [*SHORT, f"policies={policy}", *extra, f"run.skip_ahead={skip}"])
        return simulate_cluster(scenario, load_workload(scenario), policy, replicas, router)

    ref, fast = run("false"), run("true")
    assert counted["runs"] > 10
    pd.testing.assert_frame_equal(ref.requests, fast.requests, check_exact=True)
    assert ref.routed == fast.routed
    for key, value in ref.summary.items():
        assert value == fast.summary[key] or (value != value and fast.summary[key] != fast.summary[key]), key


@pytest.mark.parametrize(
    "model, hardware, tp, profile",
    [
        ("llama-3.1-8b", "h100-sxm", 1, False),
        ("llama-3.1-70b", "h100-sxm", 2, False),
        ("qwen3-30b-a3b", "h200", 1, False),  # MoE: experts touched per batch size
        ("llama-3.1-8b", "h100-sxm", 1, True),  # a measured linear form instead of the roofline
    ],
)
@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 512), first=st.integers(1, 4_000_000), steps=st.integers(1, 50))
def test_vectorised_layer_time_equals_scalar(model, hardware, tp, profile, batch, first, steps):
    scenario = load_scenario("default", [f"model={model}", f"hardware={hardware}", f"serving.tp_size={tp}"])
    shard, card = shard_model(scenario.model, tp), per_gpu_hardware(scenario.hardware, tp)
    compute = ComputeModel(shard, card, None, tp)
    if profile:
        compute.profile, compute._layer = object(), (3.1e-5, 7.3e-7, 1.3e-10)
    attended = first + batch * np.arange(steps, dtype=np.int64)
    many = compute.decode_layer_s(batch, attended)
    assert many.dtype == np.float64 and many.shape == (steps,)
    assert many.tolist() == [compute.decode_layer_s(batch, int(a)) for a in attended]


def _admits(adm, batch, generated0, ratio0, head, n, free, after_steps, make_kv, disaggregated) -> bool:
    """Whether the reference ``select`` admits the head with ``free`` blocks after ``after_steps`` decode steps of
    ``batch`` (its ``generated`` and the admission's ratio set as they would be)."""
    batch.generated = generated0 + after_steps
    adm.new_token_ratio = ratio0
    adm.on_decode_run([0.0] * after_steps, [0] * after_steps)
    return bool(list(adm.select(deque([_head(head)]), batch, make_kv(free), n, lambda: True, disaggregated)))


def _head(head: tuple) -> Request:
    """The queued request from (prompt, output, generated, prefix hash_ids over 512-token blocks)."""
    prompt, output, generated, hashes = head
    return Request(999, 0.0, prompt, output, generated, hash_ids=hashes, hash_block_tokens=512 if hashes else 0)


def _kv_factory(capacity: int, block_bytes: int, block_size: int, chains: list[tuple]):
    """A function free blocks → a fresh KvState with that many free blocks and, when ``chains`` is not empty, a
    prefix cache holding those hash chains unreferenced (evictable), so admission sees cached and evictable room."""

    def make(free: int) -> KvState:
        prefix = PrefixCache(block_size) if chains else None
        for chain in chains:
            path, _, _ = prefix.acquire(chain, len(chain) * 512, 512, 0.0)
            prefix.release(path, 0.0)
        kv = KvState(capacity, 2**50, block_bytes, 0, prefix)
        kv.device.used = capacity - free
        return kv

    return make


@pytest.mark.parametrize(
    "policy, disaggregated, prefix, overrides",
    [
        ("sglang", False, False, ["policy.sglang.decode_scheduler=prefill_adder"]),  # memory-only rule, block 1
        ("sglang", False, True, ["policy.sglang.decode_scheduler=prefill_adder"]),  # ... with a radix cache
        ("sglang", True, False, []),  # SGLang's PD decode budget (decode_scheduler: sglang_pd)
        ("headwise", False, False, []),  # memory-only rule, block_size 16
        ("pulseinfer", True, False, []),  # IO-adaptive admission with a head that runs dense
    ],
)
def test_quiet_decisions_equal_stepping_the_state(policy, disaggregated, prefix, overrides):
    """Admission.quiet_decisions' prediction equals asking ``select`` after each step, near the admission edge."""
    scenario = load_scenario("default", overrides)
    pol = make_policy(scenario, policy)
    adm, bs = admission_of(pol), pol.block_size
    rng = np.random.default_rng(7)
    block_bytes, capacity, steps = bs * pol.model.kv_bytes_per_token, 400_000, 48
    edges = 0
    for trial in range(150):
        n = int(rng.integers(1, 3 if disaggregated else 12))  # PD budget: the reservation R·n rarely binds at n ≤ 2
        batch = DecodeBatch(pol.recall_state_width)
        running = []
        for i in range(n):
            prompt, output = int(rng.integers(100, 6000)), int(rng.integers(steps + 2, 3000))
            generated = int(rng.integers(1, output - steps))
            running.append(Request(i, 0.0, prompt, output, generated, prompt + generated, device_blocks=1))
        batch.add(running)
        prompt = int(rng.integers(100, 6000))
        hashes = tuple(range(1, -(-prompt // 512) + 1)) if prefix else ()
        head = (prompt, int(rng.integers(2, 3000)), 1 if disaggregated else 0, hashes)
        # cached: a random part of the head's chain, and an unrelated chain (evictable room only)
        chains = [hashes[: int(rng.integers(0, len(hashes) + 1))], tuple(range(10**6, 10**6 + 8))] if prefix else []
        make_kv = _kv_factory(capacity, block_bytes, bs, [c for c in chains if c])
        ratio0 = float(rng.uniform(adm.ratio_min, adm.ratio_init))
        generated0 = batch.generated.copy()

        def verdict(free: int, after_steps: int, state=(batch, generated0, ratio0, head, n), kv=make_kv) -> bool:
            return _admits(adm, *state, free, after_steps, kv, disaggregated)

        lo, hi = 0, capacity  # the least free pool at which the head joins after one step (bisection)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if verdict(mid, 1) else (mid + 1, hi)
        free0 = max(0, lo + int(rng.integers(-60, 10)))
        growth = int(rng.integers(0, n + 1))  # blocks taken per step (any non-increasing free pool will do)
        free = np.maximum(0, free0 - (np.arange(steps) * growth) // bs).astype(np.int64)
        expected = next((j for j in range(steps) if verdict(int(free[j]), j + 1)), steps)
        batch.generated = generated0
        adm.new_token_ratio = ratio0
        kv = make_kv(int(free0))
        assert adm.quiet_decisions(deque([_head(head)]), batch, kv, free, disaggregated) == expected, trial
        edges += 0 < expected < steps
    assert edges >= 15, edges  # the head joined mid-run often enough for the comparison to mean something


def test_next_prefill_event_is_now_until_queued_prefills_compute():
    """A replica behind a router stops its runs at its own remote prefills: now while a prefill it sent may start
    computing now, else the earliest end of those computing (a queued one starts only when one of them ends)."""
    import simpy

    from sim.metrics.recorder import Recorder

    scenario = load_scenario(
        "default", [*SHORT, "policies=sglang", "serving.prefill=disaggregated", "serving.num_prefill_gpus=1"]
    )
    env = simpy.Environment()
    rec = Recorder(scenario.model.num_layers, 10.0, 200, False)
    replica = Replica(env, scenario, make_policy(scenario, "sglang"), np.random.default_rng(0), rec)
    assert replica.next_prefill_event_s() == np.inf
    for i, prompt in enumerate((1000, 2000, 3000)):
        replica.submit(Request(i, 0.0, prompt, 20))
    assert replica.next_prefill_event_s() == 0.0  # sent, not started: the first starts at once
    env.run(until=1e-9)  # the first computes, two wait for the GPU
    (end_s,) = replica.prefill_ends_s
    assert end_s > 1e-9 and replica.prefills_queued == 2
    assert replica.next_prefill_event_s() == end_s
    env.run(until=end_s + 1e-9)  # the first finished and fed the queue; the second computes
    assert len(replica.waiting) == 1 and replica.prefills_queued == 1
    assert replica.next_prefill_event_s() == replica.prefill_ends_s[0] > end_s


def test_arrival_ends_a_run_with_the_step_it_falls_in():
    """An arrival that only queues a request (colocated): with nobody queued the run ends with the step the arrival
    falls in, and before a step that ends exactly at it; behind a queued head that cannot join it ends nothing,
    but the run still never ends exactly at an arrival."""
    import simpy

    from sim.metrics.recorder import Recorder
    from sim.serving.arrivals import ArrivalSchedule
    from sim.serving.decode import Decode
    from sim.serving.decode_run import MAX_RUN_STEPS
    from sim.serving.policy_admission import admission_of
    from sim.step.timing import StepDevices

    def next_decode_run(pol, batch, kv, waiting, arrivals=None):  # the run builder, on a replica of just these
        replica = Decode()
        replica.env, replica.batch, replica.policy, replica.kv, replica.waiting = (
            simpy.Environment(),
            batch,
            pol,
            kv,
            waiting,
        )
        replica.rec, replica.devices, replica.draws = Recorder(pol.compute.num_layers), StepDevices(replica.env), None
        replica.disaggregated, replica.offload_runs, replica.arrivals_ahead = False, False, arrivals
        replica.admission = admission_of(pol)
        replica.next_event_s = replica.soft_event_s = lambda: np.inf
        return replica._next_run(MAX_RUN_STEPS)

    scenario = load_scenario("default", [*SHORT, "policies=sglang"])
    pol = make_policy(scenario, "sglang")
    batch = DecodeBatch(pol.recall_state_width)
    batch.add([Request(i, 0.0, 500 + 100 * i, 200, 1, 500 + 100 * i, device_blocks=40) for i in range(4)])
    kv = KvState(10**6, 2**50, pol.block_size * pol.model.kv_bytes_per_token, 0)
    kv.device.used = int(batch.blocks.sum())
    free_run = next_decode_run(pol, batch, kv, deque())
    times, last = free_run.times_s, free_run.steps  # the steps' ends with no event at all
    assert last > 6

    def steps_with(*arrivals_s: float, waiting=()) -> int:
        schedule = ArrivalSchedule(arrivals_s, 0.0)
        run = next_decode_run(pol, batch, kv, deque(waiting), schedule)
        np.testing.assert_array_equal(run.times_s, times[: run.steps + 1])  # the same steps, cut
        return run.steps

    assert steps_with(float(np.nextafter(times[3], 0.0))) == 3  # falls in step 3: the run ends with it
    assert steps_with(float(np.nextafter(times[3], 1.0))) == 4  # falls in step 4
    assert steps_with(float(times[3])) == 2  # ends exactly at step 3's end: the run stops before step 3
    held_back = [Request(9, 0.0, 10**7, 10)]  # a queued head that never fits
    assert steps_with(float(times[2]), float(times[5]), waiting=held_back) == last  # passed: nobody joins there
    assert steps_with(float(times[2]), float(times[last]), waiting=held_back) == last - 1  # not ended at one


@pytest.mark.parametrize(
    "policy, extra",
    [
        pytest.param("sglang", [], id="dense"),
        pytest.param("pulseinfer", ["policy.pulseinfer.offload_threshold_tokens=1500"], id="offloaded"),
    ],
)
def test_arrival_exactly_at_the_end_of_a_run_that_passed_arrivals(policy, extra, tmp_path, monkeypatch):
    """A run that began with requests queued passes arrivals; one more arriving exactly when it ends, as the queue's
    head joins, is seen by that decision when stepping (its timeout was scheduled before the last step's, so SimPy
    processes it first), so the run must not end there. Ties are built by adding a request at such a run's end."""
    from sim.serving.arrivals import ArrivalSchedule

    columns = [f"workload.columns.{c}={c}" for c in ("arrival_s", "prompt_tokens", "output_tokens")]
    columns[0] = "workload.columns.arrival=arrival_s"
    common = [*SHORT[:2], "hardware.hbm_gib=26", "serving.prefill=colocated", "run.progress=false",
              "run.debug_checks=true", "workload.time_scale=1", "workload.format=csv", *columns,
              f"policies={policy}", *extra]  # fmt: skip
    ties, runs = 0, []
    for rate in (20, 30, 12, 40):  # the first offered load whose runs give a tie (the step times move with the card)
        shaped = load_workload(
            load_scenario("default", [*SHORT, f"workload.target_rate_per_s={rate}", f"policies={policy}"])
        )
        base = shaped[["arrival_s", "prompt_tokens", "output_tokens"]].reset_index(drop=True)

        def overrides(df: pd.DataFrame, name: str) -> list[str]:
            df.to_csv(tmp_path / name, index=False)
            return [*common, f"workload.trace={tmp_path / name}"]

        runs = []  # (start, end) of runs that began with requests queued
        real = Replica._decode_run

        def logged(self, real=real, runs=runs):
            start, queued = self.env.now, bool(self.waiting)
            done = yield from real(self)
            if done and queued:
                runs.append((start, self.env.now))
            return done

        monkeypatch.setattr(Replica, "_decode_run", logged)
        steps = simulate(load_scenario("default", overrides(base, "base.csv"))).policies[policy].steps
        monkeypatch.setattr(Replica, "_decode_run", real)
        prefill_starts = set(steps.loc[steps["phase"] == "prefill", "start_s"])
        arrivals = base["arrival_s"].to_numpy()
        for start, end in runs:
            if end not in prefill_starts or not ((arrivals > start) & (arrivals < end)).any():
                continue  # the head does not join at the run's end, or no arrival was passed inside it
            late = pd.DataFrame({"arrival_s": [end], "prompt_tokens": [50], "output_tokens": [20]})
            df = pd.concat([base, late]).sort_values("arrival_s", kind="stable").reset_index(drop=True)
            if end not in ArrivalSchedule(df["arrival_s"], 0.0).times_s:
                continue  # its timeout would fire a bit off the run's end: no tie
            _assert_equal(*_both(overrides(df, f"tie{ties}.csv")))
            ties += 1
            if ties == 3:
                break
        if ties:
            break
    assert ties >= 1, (len(runs), "no run to build a tie on")

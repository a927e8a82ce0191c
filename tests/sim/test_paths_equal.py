"""One model: a run's tables are the same whichever path computed them — one decode step at a time or skip-ahead
(``run.skip_ahead``), the pure-Python source or its compiled form (``run.kernels``) — bit for bit, over random small
scenarios (hypothesis, derandomized): every shipped policy preset and ablation variant, io modes, private and shared
recall caches, TP 1 and 2, the three prefill modes, open-loop traces with shared prefixes and closed-loop sessions,
horizons, small KV pools (preemption, rejections) and summary-only runs.

The reference is ``run.skip_ahead=false`` with ``run.kernels=python``; each other combination is compared with it
(the ``auto`` ones only where numba is installed). A second test changes the skip-ahead path alone (each run ends
1 ns late) and checks that the same comparison fails, so the property test is known to see a one-path change.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

from sim import ScenarioError, load_scenario
from sim.config.loader import policy_presets
from sim.config.policy import IO_MODES
from sim.run import PolicyResult, SimResult, simulate
from sim.serving.kv import CapacityError
from sim.serving.replica import Replica
from tests.sim.test_scenario_properties import POLICY_VALID

HAVE_NUMBA = importlib.util.find_spec("numba") is not None
REFERENCE = ("false", "python")  # (run.skip_ahead, run.kernels): one decode step at a time, pure Python
PATHS = [("true", "python"), *([("false", "auto"), ("true", "auto")] if HAVE_NUMBA else [])]

BASE = "ablation"  # the default's model, card and serving layout, plus the ablation ladder's variants
POLICIES = list(dict.fromkeys([*policy_presets(), *load_scenario(BASE).policies]))  # presets, then variants
_KINDS = load_scenario(BASE, [f"policies={','.join(POLICIES)}"]).policy
OFFLOAD = [name for name in POLICIES if _KINDS[name].kind == "offload"]
PROMPTS = [200, 1500, 6000, 20000, 60000]  # tokens; the default offload threshold is 8192
MOONCAKE_BLOCK, SESSION_BLOCK = 512, 64  # tokens per hash_ids block of each trace format


@st.composite
def open_loop(draw) -> list[dict]:
    """Mooncake-format rows: 1-6 requests, arrivals ms apart, whose prompts share a drawn number of prefix blocks."""
    shared, rows, t_ms = draw(st.integers(0, 12)), [], 0
    for i in range(draw(st.integers(1, 6))):
        t_ms += draw(st.sampled_from([0, 30, 400, 3000]))
        prompt = draw(st.sampled_from(PROMPTS))
        blocks = -(-prompt // MOONCAKE_BLOCK)
        common = min(shared, blocks)
        own = range(10_000 * (i + 1), 10_000 * (i + 1) + blocks - common)
        row = {"timestamp": t_ms, "input_length": prompt, "output_length": draw(st.integers(1, 40))}
        rows.append({**row, "hash_ids": [*range(common), *own]})
    return rows


@st.composite
def sessions(draw) -> list[dict]:
    """kv-cache-tester sessions: 1-3 of 1-3 turns; each turn's context is the last one's plus its answer and new
    input, its hash_ids extend the last turn's chain."""
    out = []
    for s in range(draw(st.integers(1, 3))):
        context, requests = 0, []
        for _turn in range(draw(st.integers(1, 3))):
            context += draw(st.sampled_from(PROMPTS[:4]))
            ids = list(range(100_000 * (s + 1), 100_000 * (s + 1) + context // SESSION_BLOCK))
            n_out = draw(st.sampled_from([0, 3, 17, 40]))
            think = draw(st.sampled_from([0.0, 0.05, 1.5]))  # a first turn's too: a session may start late
            requests.append({"t": 0.0, "type": "n", "in": context, "out": n_out, "think_time": think, "hash_ids": ids})
            context += n_out
        out.append({"id": f"s{s}", "block_size": SESSION_BLOCK, "requests": requests})
    return out


def _offload_knobs(draw, name: str) -> list[str]:
    """Overrides of one offload policy: io mode, recall cache, offload threshold and up to two other knobs."""
    knobs = {"offload_threshold_tokens": draw(st.sampled_from([16, 1024, 8192]))}
    if draw(st.booleans()):
        knobs["io"] = draw(st.sampled_from(IO_MODES))
    cache = draw(st.sampled_from(["per_request", "shared", "shared_sized"]))
    if cache != "per_request":
        knobs["recall_cache"] = "shared"
        if cache == "shared_sized":
            knobs["recall_cache_gib"] = draw(st.sampled_from([0.005, 0.05, 1.0]))
    for key in draw(st.lists(st.sampled_from(sorted(POLICY_VALID)), max_size=2, unique=True)):
        knobs.setdefault(key, draw(st.sampled_from(POLICY_VALID[key])))
    return [f"policy.{name}.{key}={value}" for key, value in knobs.items()]


@st.composite
def scenarios(draw) -> tuple[list[str], str, list[dict]]:
    """(``--set`` overrides of :data:`BASE` without the workload's path, workload kind, its trace rows)."""
    policies = draw(st.lists(st.sampled_from(POLICIES), min_size=1, max_size=2, unique=True))
    kind = draw(st.sampled_from(["open_loop", "sessions"]))
    rows = draw(open_loop() if kind == "open_loop" else sessions())
    items = [
        f"policies={','.join(policies)}",
        f"serving.prefill={draw(st.sampled_from(['disaggregated', 'colocated', 'none']))}",
        f"serving.tp_size={draw(st.sampled_from([1, 2]))}",
        f"seed={draw(st.integers(0, 3))}",
        "workload.time_scale=1",
        "run.progress=false",
        "run.debug_checks=true",
    ]
    if items[1] == "serving.prefill=colocated" and draw(st.booleans()):
        items.append("serving.mixed_prefill=true")  # prefill chunks ride in decode steps
    if items[1] == "serving.prefill=disaggregated":
        items.append(f"serving.num_prefill_gpus={draw(st.sampled_from([1, 8]))}")  # 1: remote prefills queue
    if kind == "sessions":
        items.append(f"workload.sessions.session_rate_per_s={draw(st.sampled_from([0.5, 20.0]))}")
        if draw(st.booleans()):
            items.append("workload.sessions.max_concurrent_sessions=1")
    horizon = draw(st.sampled_from([None, None, 0.3, 2.0]))
    if horizon is not None:
        items.append(f"run.horizon_s={horizon}")
    if draw(st.integers(0, 3)) == 0:  # a KV pool of a few GiB: queues, preemption, rejections
        items.append(f"hardware.hbm_gib={draw(st.sampled_from([41.0, 43.0]))}")
    if draw(st.integers(0, 5)) == 0:
        items.append("run.tables=summary")
    for name in (p for p in policies if p in OFFLOAD):
        items.extend(_offload_knobs(draw, name))
    return items, kind, rows


def _write_trace(folder: Path, kind: str, rows: list[dict]) -> list[str]:
    """Write the drawn trace under ``folder``; the overrides that point the workload at it."""
    if kind == "open_loop":
        path = folder / "trace.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return [f"workload.trace={path}", "workload.format=mooncake"]
    path = folder / "sessions"
    path.mkdir()
    for i, session in enumerate(rows):
        (path / f"trace_{i:04d}.json").write_text(json.dumps(session))
    return [f"workload.trace={path}", "workload.format=kvcache_tester"]


def run_paths(overrides: list[str], paths=(REFERENCE, *PATHS)) -> dict[tuple[str, str], SimResult]:
    """:func:`simulate` of ``BASE`` with ``overrides`` on each (skip_ahead, kernels) path.

    Raises:
        ScenarioError, CapacityError: the scenario is refused (the same on every path: raised by the first).
    """
    return {
        (skip, kernels): simulate(load_scenario(BASE, [*overrides, f"run.skip_ahead={skip}", f"run.kernels={kernels}"]))
        for skip, kernels in paths
    }


def assert_identical(ref: SimResult, other: SimResult, label: str = "") -> None:
    """Every table and value of two results equal bit for bit: the workload and, per policy, every field of
    :class:`PolicyResult` (DataFrames with ``check_exact``, the summary key by key with NaN equal to NaN)."""
    pd.testing.assert_frame_equal(ref.workload, other.workload, check_exact=True, obj=f"{label} workload")
    assert list(ref.policies) == list(other.policies), label
    for name, a in ref.policies.items():
        b = other.policies[name]
        for field in dataclasses.fields(PolicyResult):
            x, y, where = getattr(a, field.name), getattr(b, field.name), f"{label} {name} {field.name}"
            if isinstance(x, pd.DataFrame):
                assert isinstance(y, pd.DataFrame), where
                pd.testing.assert_frame_equal(x, y, check_exact=True, obj=where)
            elif isinstance(x, dict):
                assert list(x) == list(y), where
                for key, value in x.items():
                    assert _same(value, y[key]), (where, key, value, y[key])
            else:
                assert _same(x, y), (where, x, y)


def _same(x, y) -> bool:
    """Equal, or both NaN (a float that is not equal to itself)."""
    return type(x) is type(y) and (x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)))


@pytest.fixture
def runs(monkeypatch) -> Counter:
    """Counts the skip-ahead runs the compared paths took (``runs``) and those of a batch holding offloaded requests
    (``offloaded_runs``)."""
    counts: Counter = Counter()
    real = Replica._decode_run

    def counted(self):
        offloaded = bool(np.count_nonzero(self.batch.offloaded))
        done = yield from real(self)
        counts["runs"] += bool(done)
        counts["offloaded_runs"] += bool(done) and offloaded
        return done

    monkeypatch.setattr(Replica, "_decode_run", counted)
    return counts


def test_every_table_equal_on_every_path(runs):
    outcomes: Counter = Counter()

    @settings(
        max_examples=40, derandomize=True, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
    )
    @given(scenario=scenarios())
    def check(scenario):
        overrides, kind, rows = scenario
        with tempfile.TemporaryDirectory() as tmp:
            overrides = [*overrides, *_write_trace(Path(tmp), kind, rows)]
            note(f"overrides: {overrides}")
            try:
                results = run_paths(overrides)
            except (ScenarioError, CapacityError):  # e.g. a card too small for the weights: refused alike on every path
                outcomes["refused"] += 1
                assume(False)
            ref = results[REFERENCE]
            for path in PATHS:
                assert_identical(ref, results[path], f"{path} vs {REFERENCE}:")
            outcomes[kind] += 1
            outcomes["offloaded"] += any(r.requests["offloaded"].any() for r in ref.policies.values())

    check()
    # the comparison meant something: scenarios ran, of both kinds, and skip-ahead took runs, offloaded ones too
    assert outcomes["open_loop"] >= 8 and outcomes["sessions"] >= 8, outcomes
    assert outcomes["offloaded"] >= 5, outcomes
    assert runs["runs"] >= 30 and runs["offloaded_runs"] >= (5 if HAVE_NUMBA else 0), (runs, outcomes)


SENSITIVE = [
    "policies=sglang,pulseinfer", "serving.prefill=colocated", "workload.trace=null", "workload.time_scale=1",
    "workload.synthetic.num_requests=4", "workload.synthetic.rate_per_s=5",
    "workload.synthetic.prompt_tokens_mean=3000", "workload.synthetic.output_tokens_mean=30",
    "policy.pulseinfer.offload_threshold_tokens=16", "run.progress=false",
]  # fmt: skip


def test_a_change_to_one_path_alone_fails_the_comparison(runs, monkeypatch):
    """Each skip-ahead run ending 1 ns late (the stepped reference untouched) makes :func:`assert_identical` fail,
    while without the change the same scenario passes: the property test sees a change made on one path only."""
    paths = (REFERENCE, ("true", "python"))
    ref, fast = run_paths(SENSITIVE, paths).values()
    assert_identical(ref, fast)
    assert runs["runs"] > 0, runs
    real = Replica._decode_run  # the counting wrapper: runs are still counted

    def late(self):
        done = yield from real(self)
        if done:
            yield self.env.timeout(1e-9)
        return done

    monkeypatch.setattr(Replica, "_decode_run", late)
    ref, fast = run_paths(SENSITIVE, paths).values()
    with pytest.raises(AssertionError, match="are different"):  # a table's values, not its shape or keys
        assert_identical(ref, fast)

"""Any scenario the schema can express either runs to completion with every invariant holding, or is refused with
exit 2 and one line — never a traceback (hypothesis over small synthetic workloads and knob values, valid and not).

Invariants checked on a completed run (``run.debug_checks: true`` adds the simulator's own block-conservation
and pool checks every step): no request lost (each arrived request is finished or has an unfinished reason, per
policy), HBM and host DRAM never exceeded (steps.csv ``hbm_used_bytes`` / ``host_used_bytes``).
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from plots.tables import read_table
from pulseinfer.cli import main
from sim.config import GIB, load_scenario

POLICY_NAMES = ["sglang", "pulseinfer", "headwise", "full_offload"]
OFFLOAD = ["pulseinfer", "headwise", "full_offload"]


VALID: dict[str, list] = {
    "hardware": ["h100-sxm", "a100-80gb", "h200"],
    "hardware.hbm_gib": [40, 80, 141],
    "hardware.host_dram_gib": [4, 64, 512],
    "hardware.h2d_bandwidth_gbps": [5, 55],
    "hardware.reserve_gib": [0, 4],
    "model.max_seq_len": [32768, 131072],
    "serving.prefill": ["colocated", "disaggregated", "none"],
    "workload.synthetic.prompt_tokens_cv": [0, 1.0, 3.0],
    "slo.tpot_ms": [50, 200],
}
POLICY_VALID: dict[str, list] = {  # knobs of an offload policy that runs (overrides of others are refused)
    "budget_tokens": [512, 2048],
    "sink_tokens": [0, 64],
    "recent_tokens": [0, 256],
    "lookahead_layers": [1, 3, 32],
    "offload_threshold_tokens": [1, 512, 8192],
    "scheduling": ["sequential", "interruptible"],
    "admission": ["static", "io_adaptive"],
    "max_running_requests": [1, 4, 256],
}
# Values no scenario may run with (wrong type, sign or size, or impossible together with the model and host).
INVALID = [
    "workload.synthetic.num_requests=0", "workload.synthetic.num_requests=-2", "workload.synthetic.rate_per_s=0",
    "workload.synthetic.prompt_tokens_mean=1e9", "workload.synthetic.output_tokens_mean=-1",
    "workload.synthetic.num_requests=1e15", "hardware.hbm_gib=0.5", "hardware.hbm_gib=-1",
    "hardware.host_dram_gib=0.01", "hardware.h2d_bandwidth_gbps=0", "hardware.reserve_gib=200", "model.max_seq_len=0",
    "model.num_layers=0", "serving.prefill=bogus", "slo.tpot_ms=0", "policy.pulseinfer.budget_tokens=0",
    "policy.pulseinfer.budget_tokens=10000000", "policy.headwise.sink_tokens=10000000",
    "policy.pulseinfer.recent_tokens=10000000", "policy.pulseinfer.lookahead_layers=41",
    "policy.pulseinfer.lookahead_layers=0", "policy.full_offload.offload_threshold_tokens=100000000",
    "policy.pulseinfer.micro_batches=2", "policy.pulseinfer.max_running_requests=0",
    "policy.pulsinfer.budget_tokens=512",
    "policies=sglang,sglang", "policies=vllm", "workload.synthetic.prompt_tokens_cv=20",
]  # fmt: skip


@st.composite
def scenarios(draw) -> list[str]:
    """``--set`` items of one scenario: a tiny synthetic workload plus valid knobs across every section, and,
    in about a third of the examples, one value no scenario may run with (it comes last, so it wins)."""
    policies = draw(st.lists(st.sampled_from(POLICY_NAMES), min_size=1, max_size=3, unique=True))
    items = [
        "workload.trace=null",
        f"workload.synthetic.num_requests={draw(st.sampled_from([1, 3, 8]))}",
        f"workload.synthetic.rate_per_s={draw(st.sampled_from([0.5, 5.0, 50.0]))}",
        f"workload.synthetic.prompt_tokens_mean={draw(st.sampled_from([16, 900, 6000, 20000]))}",
        f"workload.synthetic.output_tokens_mean={draw(st.sampled_from([1, 8, 24]))}",
        f"policies={','.join(policies)}",
        "run.debug_checks=true",
        "run.horizon_s=3600",
    ]
    valid = {**VALID}
    for policy in (p for p in policies if p in OFFLOAD):
        valid |= {f"policy.{policy}.{knob}": values for knob, values in POLICY_VALID.items()}
    for key in draw(st.lists(st.sampled_from(sorted(valid)), max_size=8, unique=True)):
        items.append(f"{key}={draw(st.sampled_from(valid[key]))}")
    if draw(st.integers(0, 2)) == 0:
        items.append(draw(st.sampled_from(INVALID)))
    return items


def _check_invariants(out: Path, overrides: list[str]) -> None:
    scenario = load_scenario(out / "scenario.yaml")
    requests, steps = read_table(out, "requests"), read_table(out, "steps")  # csv or parquet (run.table_format)
    arrived = scenario.workload.synthetic.num_requests
    for policy in scenario.policies:
        mine = requests[requests["policy"] == policy]
        assert len(mine) == arrived, (policy, len(mine), overrides)  # nothing lost
        done = mine["finished"].astype(bool)
        assert (done | mine["unfinished_reason"].notna()).all(), overrides  # an empty reason reads as NaN
        used = steps[steps["policy"] == policy]
        assert (used["hbm_used_bytes"] <= scenario.hardware.hbm_bytes).all(), overrides
        assert (used["host_used_bytes"] <= scenario.hardware.host_dram_gib * GIB).all(), overrides


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(overrides=scenarios())
def test_any_scenario_runs_with_invariants_or_is_refused_in_one_line(overrides):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        argv = ["simulate", "--no-progress", "--out", str(out)] + [a for o in overrides for a in ("--set", o)]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(argv)  # a bug raises here, with its traceback, and fails the test
        if rc == 2:
            lines = err.getvalue().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), (lines, overrides)
            assert not out.exists()
            event("refused")
        else:
            assert rc == 0, (rc, err.getvalue(), overrides)
            _check_invariants(out, overrides)
            event("ran")

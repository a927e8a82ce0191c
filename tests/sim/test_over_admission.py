"""Over-admission with a shared recall cache (SparseServe's Fig. 1 effect, docs/sources.md §2.2).

A long-context decode workload (prompts ~32K tokens, all queued at once, prefill not simulated) is served with
the batch cap (``max_running_requests``) raised step by step. With one shared HBM recall cache per GPU, a
head-wise offloader with memory-only admission keeps admitting until the batch's working sets exceed the cache;
then every selected block misses and decode throughput falls. PulseInfer's IO-adaptive admission predicts the
working sets against the cache and holds the batch there, so raising the cap costs it nothing.
"""

from __future__ import annotations

import pytest

from sim.config import load_scenario
from sim.run import simulate

CAPS = (8, 32, 128)


def _summary(policy: str, cap: int) -> dict:
    scn = load_scenario(
        "default",
        [
            f"policies={policy}",
            "serving.prefill=none",
            "workload.trace=null",
            "workload.time_scale=1",
            "workload.synthetic.num_requests=80",
            "workload.synthetic.rate_per_s=1000",
            "workload.synthetic.prompt_tokens_mean=32768",
            "workload.synthetic.prompt_tokens_cv=0.2",
            "workload.synthetic.output_tokens_mean=128",
            "workload.synthetic.output_tokens_cv=0.2",
            f"policy.{policy}.max_running_requests={cap}",
            f"policy.{policy}.recall_cache=shared",
            f"policy.{policy}.recall_cache_gib=8",
            "run.progress=false",
        ],
    )
    return simulate(scn).policies[policy].summary


@pytest.fixture(scope="module")
def curves() -> dict[str, dict[int, dict]]:
    return {policy: {cap: _summary(policy, cap) for cap in CAPS} for policy in ("headwise", "pulseinfer")}


def test_headwise_without_admission_falls_once_the_batch_outgrows_the_shared_cache(curves):
    tokens_per_s = {cap: s["decode_tokens_per_s"] for cap, s in curves["headwise"].items()}
    assert max(tokens_per_s.values()) >= 1.3 * tokens_per_s[CAPS[-1]]
    # the fall comes from cache misses, not from a smaller batch
    assert curves["headwise"][CAPS[-1]]["recall_miss_frac"] > 2 * curves["headwise"][CAPS[0]]["recall_miss_frac"]


def test_pulseinfer_with_io_adaptive_admission_stays_within_five_percent_of_its_peak(curves):
    tokens_per_s = {cap: s["decode_tokens_per_s"] for cap, s in curves["pulseinfer"].items()}
    assert tokens_per_s[CAPS[-1]] >= 0.95 * max(tokens_per_s.values())

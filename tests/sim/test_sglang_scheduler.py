"""SGLang's disaggregated decode admission, retraction rules and the client-side TTFT/TPOT, checked by hand."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from sim.config import load_scenario
from sim.policies import make_policy
from sim.run import simulate
from sim.serving.admission import OK
from sim.serving.decode_admission import DecodeAdmission
from sim.serving.kv import KvState
from sim.serving.policy_admission import admission_of
from sim.serving.request import DecodeBatch, Request

R, CLIP = 512, 4096  # SGLang's num_reserved_decode_tokens and max_new_tokens clip


def _policy(*overrides: str):
    scn = load_scenario("default", ["policies=sglang", "workload.max_requests=10", "run.progress=false", *overrides])
    return make_policy(scn, "sglang")


def _running(prompt: int, generated: int, output: int) -> DecodeBatch:
    r = Request(0, 0.0, prompt, output, generated=generated)
    r.prefill_target, r.device_blocks = prompt + generated - 1, prompt + generated - 1
    batch = DecodeBatch()
    batch.add([r])
    return batch


def _admits(adm: DecodeAdmission, kv: KvState, batch: DecodeBatch, req: Request) -> bool:
    taken = list(adm.select(deque([req]), batch, kv, len(batch), lambda: True, True))
    return taken == [(req, OK)]


def test_the_sglang_preset_uses_the_decode_rule():
    assert isinstance(admission_of(_policy()), DecodeAdmission)


@pytest.mark.parametrize("slack", [0, -1])
def test_decode_admission_threshold_by_hand(slack):
    adm = admission_of(_policy())
    batch = _running(prompt=10_000, generated=100, output=6_000)  # output clipped at 4096 in the estimate
    retractable = 10_000 + 100
    single = 10_000 + CLIP - retractable
    new = Request(1, 0.0, 20_000, 300, generated=1)
    required = 20_000 + R  # fill = prompt + max(generated - 1, 0)
    # free − max(R · active, single) must reach max(required, prompt + min(output, clip) − retractable)
    free = max(required, 20_000 + 300 - retractable) + max(R * 1, single) + slack
    kv = KvState(10**7, 0, 1, 0)
    kv.device.allocate(kv.device.capacity - free)
    assert _admits(adm, kv, batch, new) is (slack == 0)


@pytest.mark.parametrize(("capacity", "admitted"), [(3000 + 3 * R - 1, 2), (3000 + 3 * R, 3)])
def test_decode_admission_counts_each_admitted_request_against_the_reserve(capacity, admitted):
    # The k-th 1000-token request (k = 0, 1, 2) needs 1000 + R free beyond R for each of the k admitted before
    # it: three fit exactly when the pool holds 3 · 1000 + 3 · R tokens.
    adm = admission_of(_policy())
    kv = KvState(capacity, 0, 1, 0)
    reqs = deque(Request(i, 0.0, 1000, 10, generated=1) for i in range(3))
    assert len(list(adm.select(reqs, DecodeBatch(), kv, 0, lambda: True, True))) == admitted


def test_new_token_ratio_after_a_retraction_is_sglangs_estimate():
    adm = admission_of(_policy())
    batch = _running(prompt=100, generated=50, output=400)
    adm.on_preempt(batch)
    assert adm.new_token_ratio == pytest.approx(min(1.0, (50 + 20 * 1) / (400 + 1)))
    reset = admission_of(_policy("policy.sglang.retract_ratio=reset"))
    reset.new_token_ratio = 0.2
    reset.on_preempt(batch)
    assert reset.new_token_ratio == reset.ratio_init


def _pressure(*overrides: str):
    # A small pool forces retractions: 20 requests of 6K + 2K tokens on ~9 GiB of KV.
    return load_scenario(
        "default",
        [
            "policies=sglang", "run.progress=false", "run.debug_checks=true", "workload.trace=null",
            "workload.time_scale=1", "workload.synthetic.num_requests=20", "workload.synthetic.rate_per_s=50",
            "workload.synthetic.prompt_tokens_mean=6000", "workload.synthetic.output_tokens_mean=2000",
            "workload.synthetic.prompt_tokens_cv=0", "workload.synthetic.output_tokens_cv=0",
            "hardware.hbm_gib=50", "hardware.reserve_gib=12.5", "policy.sglang.decode_scheduler=prefill_adder",
            *overrides,
        ],
    )  # fmt: skip


def test_swapped_retractions_finish_without_a_second_prefill():
    swap = simulate(_pressure()).policies["sglang"]
    recompute = simulate(_pressure("policy.sglang.retract=recompute")).policies["sglang"]
    assert swap.summary["num_preemptions"] > 0 and recompute.summary["num_preemptions"] > 0
    assert swap.summary["finished"] == recompute.summary["finished"] == 20
    # Recompute sends a retracted request back through remote prefill; its first token time is unchanged
    # either way, but only recompute waits for a prefill GPU again, so swap finishes no later on average.
    assert swap.requests["e2e_s"].mean() <= recompute.requests["e2e_s"].mean()


def test_client_ttft_includes_the_decode_queue_wait():
    res = simulate(_pressure("policy.sglang.decode_scheduler=sglang_pd")).policies["sglang"]
    rq = res.requests[res.requests["finished"]]
    np.testing.assert_allclose(rq["ttft_client_s"], rq["ttft_s"] + rq["decode_queue_wait_s"], rtol=1e-12)
    assert (rq["decode_queue_wait_s"] >= 0).all() and (rq["decode_queue_wait_s"] > 0).any()
    assert (rq["tpot_client_s"] <= rq["tpot_s"] + 1e-12).all()


def test_colocated_client_view_equals_the_engine_view():
    res = simulate(_pressure("serving.prefill=colocated")).policies["sglang"]
    rq = res.requests[res.requests["finished"]]
    np.testing.assert_allclose(rq["ttft_client_s"], rq["ttft_s"], rtol=1e-12)
    assert (rq["decode_queue_wait_s"] == 0).all()

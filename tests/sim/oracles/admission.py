"""Admission's per-step reference: whether the head of the queue would join now, written for one decision with
Python's ``min`` / ``max`` as sim/serving/admission.py (``Admission._try``) and sim/serving/decode_admission.py
(``DecodeAdmission._decide_decode``) computed it before each rule was written once for the decision now and the
next m decisions. tests/sim/test_admission.py checks ``select`` and ``quiet_decisions`` against it, bit for bit,
and the IO-adaptive budget's φ over a run against :func:`aimd_step` one step at a time."""

from __future__ import annotations

from sim.serving.admission import Admission
from sim.serving.decode_admission import DecodeAdmission
from sim.serving.io_admission import LINK_IDLE_BUSY_FRAC, PHI_DECREASE, PHI_INCREASE, PHI_MAX, PHI_MIN
from sim.serving.kv import KvState
from sim.serving.request import DecodeBatch, Request


def memory_joins(adm: Admission, req: Request, batch: DecodeBatch, kv: KvState, disaggregated: bool) -> bool:
    """The memory rule for the head of the queue with the batch, ratio and pools as they are (no prefix cache)."""
    p = adm.params
    offloaded = adm.offload_possible(req, kv)
    target = req.prompt_tokens + req.generated - (1 if disaggregated else 0)
    need, worst = p.device_blocks(target, offloaded), p.device_blocks(req.total_tokens, offloaded)
    if offloaded and (kv.num_offloaded >= adm.max_offloaded or req.total_tokens * p.kv_bytes_per_token > kv.host.free):
        return False
    reserved = 0.0
    if len(batch):
        future = [min(o - g, adm.clip_max_new_tokens) for o, g in zip(batch.output.tolist(), batch.generated.tolist())]
        blocks = sum(p.growth_blocks(f, bool(off)) for f, off in zip(future, batch.offloaded.tolist()))
        reserved = float(blocks) * adm.new_token_ratio
    future_blocks = p.growth_blocks(min(req.output_tokens - req.generated, adm.clip_max_new_tokens), offloaded)
    return not min(need + future_blocks * adm.new_token_ratio, worst) > kv.device.free - reserved


def decode_budget_joins(adm: DecodeAdmission, req: Request, batch: DecodeBatch, kv: KvState) -> bool:
    """SGLang's decode budget for the head of the queue with the batch and pool as they are (no prefix cache)."""
    bs, r, clip = adm.block_size, adm.reserved_tokens, adm.clip_max_new_tokens
    prompts, generated, outputs = batch.prompt.tolist(), batch.generated.tolist(), batch.output.tolist()
    retractable = sum(p + g for p, g in zip(prompts, generated))
    single = max((p + min(o, clip) for p, o in zip(prompts, outputs)), default=retractable) - retractable
    allocatable = kv.device.free - -(-max(r * len(batch), single) // bs)
    required = adm.params.device_blocks(req.prompt_tokens + max(req.generated - 1, 0), False) + -(-r // bs)
    worst = -(-(req.prompt_tokens + min(req.output_tokens, clip) - retractable) // bs)
    return not max(required, worst) > allocatable


def aimd_step(phi: float, stall_target: float, step_s: float, stall_s: float, link_busy_s: float) -> float:
    """φ after one decode step, as sim/serving/io_admission.py (``RecallBudget``) computed it before the AIMD rule was
    written once over a run's steps: ×0.8 when the stall exceeded its target share of the step, +0.05 when it stayed
    under half of it and the link was busy less than 80 % of the step; within [0.25, 3]."""
    if step_s <= 0:
        return phi
    if stall_s > stall_target * step_s:
        return max(PHI_MIN, phi * PHI_DECREASE)
    if stall_s < 0.5 * stall_target * step_s and link_busy_s < LINK_IDLE_BUSY_FRAC * step_s:
        return min(PHI_MAX, phi + PHI_INCREASE)
    return phi

"""The admission a policy's replica asks, built in serving from what the policy supplies.

Serving owns the admission rules (sim/serving/admission.py, decode_admission.py, io_admission.py) and their
construction; a policy (sim/policies/) supplies plain inputs only: its policy section's knobs, its block rule
(``device_blocks``, with ``held=False`` for the growth, ``wants_offload``) and, for IO-adaptive admission, an offload
policy's expected per-layer I/O-path seconds (``OffloadServing.io_layer_s``). So policies import nothing from
serving (docs/design.md §3).

:func:`admission_of` builds one admission per policy object on first use (so one per replica: each replica has its
own policy object) and returns the same one after: the replica's scheduler and the skip-ahead run's bound
(sim/serving/decode_run.py ``fitting_steps``) ask the same state. The policy object carries it (in its ``__dict__``,
as ``functools.cached_property`` would), so it lives exactly as long as the policy; a weak-keyed table would not do:
the admission refers to the policy through its block rule, so its entry would never die.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from sim.policies.base import Policy
from sim.policies.offload import OffloadServing
from sim.serving.admission import Admission, AdmissionParams, IoBoundParams
from sim.serving.decode_admission import DecodeAdmission
from sim.serving.io_admission import IoAdaptiveAdmission

_CARRIED = "_admission"  # the attribute of a policy object that carries the admission built for it


def admission_of(policy: Policy) -> Admission:
    """Who joins ``policy``'s batch, built on first use (one per policy object, so one per replica): for a dense
    policy SGLang's decode budget (``decode_scheduler: sglang_pd``) or the memory rule; for an offload policy
    memory-only admission, or the IO-adaptive kind with its recall-vs-compute bound (an offload policy does not read
    ``decode_scheduler``: it never takes SGLang's decode budget)."""
    carried = vars(policy)
    admission = carried.get(_CARRIED)
    if admission is None:
        admission = carried[_CARRIED] = _build(policy)
    return admission


def _build(policy: Policy) -> Admission:
    params = admission_params(policy)
    if isinstance(policy, OffloadServing):
        return IoAdaptiveAdmission(params) if params.io is not None else Admission(params)
    return DecodeAdmission(params) if policy.params.decode_scheduler == "sglang_pd" else Admission(params)


def admission_params(policy: Policy) -> AdmissionParams:
    """What admission takes from ``policy``: its knobs and its block accounting; for an offload policy also the
    offloaded-slot cap and, for ``admission: io_adaptive``, the inputs of the I/O bound (one warm and one cold
    request's expected per-layer I/O-path seconds)."""
    params = AdmissionParams(
        knobs=policy.params,
        max_offloaded=0,
        kv_bytes_per_token=policy.model.kv_bytes_per_token,
        max_seq_len=policy.model.max_seq_len,
        device_blocks=policy.device_blocks,
        growth_blocks=partial(policy.device_blocks, held=False),
        wants_offload=policy.wants_offload,
    )
    if not isinstance(policy, OffloadServing):
        return params
    knobs, io = policy.params, None
    if knobs.admission == "io_adaptive":
        warm_s, cold_s = policy.io_layer_s()
        io = IoBoundParams(warm_s, cold_s, policy.sparse_tokens, policy.tpot_slo_s, policy.compute, policy.cache_holds)
    return replace(params, max_offloaded=knobs.max_offloaded_requests, io=io)

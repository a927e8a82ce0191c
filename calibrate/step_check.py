"""Step-time check: the simulator's time for each scheduler iteration a real engine recorded, against its wall time.

Input: an :class:`~traces.measured.IterationRun` (per-iteration ``ForwardPassMetrics`` of SGLang or vLLM through
Dynamo, ``traces/measured/forward_pass.py``) and a scenario whose model, GPU, engine and tensor parallelism match the
run. For every iteration the batch composition the engine recorded — its decode requests with their summed context,
its prefill requests with the tokens computed and the KV they read — is timed with the simulator's own step model,
the functions the dense (``sglang``) policy's replica uses, in the same combination:

- **decode-only** (sim/serving/decode.py ``Decode._next_run`` → sim/step/timing.py ``StepDevices.time_run``, its
  recall-free branch): one layer by ``Policy.recall_free_step`` (``ComputeModel.decode_layer_s`` of the batch size
  and the attended tokens; the layer depends on their sum only, so the recorded sum is what it needs), the step by
  :func:`sim.step.pipeline.idle_step_s` — ``ComputeModel.step_overhead_s`` + ``num_layers`` layers +
  ``ComputeModel.decode_head_s`` of the decode requests, at least ``ComputeModel.overlapped_host_s``;
- **mixed** (sim/serving/prefill.py ``Prefill._prefill`` with ``serving.mixed_prefill``: the running batch's decode
  step carries the chunks): the same decode step with ``ComputeModel.prefill_extra_s`` of the chunks added to its
  host overhead — used for every mixed iteration, also where the scenario does not set ``mixed_prefill`` (the
  engine did run one forward);
- **prefill-only** (``Prefill._prefill`` without a decode batch): ``ComputeModel.prefill_s`` of the chunks.

Those replica methods are private and drive a SimPy clock, a KV pool and an admission, so the check calls the
public pieces they are built from, in their order; nothing here computes a time itself.

What the records do not say, and what is assumed: how the prefill tokens and the read KV split between the prefill
requests (evenly: ``divmod``; their attention FLOPs grow with the square of a chunk, so a skewed split would take
longer), and how many prefill requests complete their prompt in the iteration (all: each adds its LM head); the
sum of the decode requests' context is taken as the attended tokens (SGLang's ``seqlen`` and Dynamo's "prompt +
generated so far" include the token being decoded, as the simulator's ``ctx + 1`` does). The decode requests'
context spread (``var_decode_kv_tokens``) does not enter: the simulator's decode layer reads only the sum. HiCache
loads, recall and CUDA-graph capture outside the engine card are not in the records and not modelled here.

Output (:func:`step_check`), one row per iteration: ``iteration``, ``kind`` ("decode_only", "mixed",
"prefill_only"), the composition (``num_decode_requests``, ``sum_decode_kv_tokens``, ``mean_decode_context`` =
their ratio in tokens, NaN without decodes; ``num_prefill_requests``, ``num_prefill_tokens``,
``sum_prefill_kv_tokens``), ``measured_s`` (the record's wall time), ``simulated_s`` (seconds) and ``error_pct`` =
100 · (simulated − measured) / measured. :func:`step_check_summary` aggregates it per kind.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from sim.config import Scenario
from sim.policies import Policy, make_policy
from sim.step.pipeline import idle_step_s
from traces.measured.forward_pass import KINDS, IterationRun

STEP_CHECK_COLUMNS: list[str] = [
    "iteration",
    "kind",
    "num_decode_requests",
    "sum_decode_kv_tokens",
    "mean_decode_context",
    "num_prefill_requests",
    "num_prefill_tokens",
    "sum_prefill_kv_tokens",
    "measured_s",
    "simulated_s",
    "error_pct",
]
SUMMARY_PERCENTILES = (10, 50, 90)


def step_check(iterations: IterationRun, scenario: Scenario, policy: str | None = None) -> pd.DataFrame:
    """The simulator's time for each recorded iteration beside the measured one (module docstring).

    Args:
        iterations: the engine's iterations (``traces.measured.read_forward_pass_metrics``).
        scenario: the simulated deployment (model, hardware, engine card, ``serving.tp_size``, profile).
        policy: the scenario policy whose step model times the iterations; default: its first ``dense`` policy.

    Returns:
        One row per iteration, columns :data:`STEP_CHECK_COLUMNS` (seconds; error in percent).

    Raises:
        ValueError: ``policy`` is not one of the scenario's, or is not dense (an offloading policy's step depends on
            recall state the records do not carry), or the scenario has no dense policy.
    """
    pol = _dense_policy(scenario, policy)
    table = iterations.iterations
    n_dec = table["num_decode_requests"].to_numpy(dtype=np.int64)
    kv_dec = table["sum_decode_kv_tokens"].to_numpy(dtype=np.int64)
    n_pre = table["num_prefill_requests"].to_numpy(dtype=np.int64)
    tok_pre = table["num_prefill_tokens"].to_numpy(dtype=np.int64)
    kv_pre = table["sum_prefill_kv_tokens"].to_numpy(dtype=np.int64)
    compositions = zip(n_dec.tolist(), kv_dec.tolist(), n_pre.tolist(), tok_pre.tolist(), kv_pre.tolist(), strict=True)
    simulated = np.array([iteration_s(pol, *composition) for composition in compositions], dtype=np.float64)
    measured = table["wall_time_s"].to_numpy(dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_context = np.where(n_dec > 0, kv_dec / np.maximum(n_dec, 1), np.nan)
        error = (simulated - measured) / measured * 100.0
    out = pd.DataFrame(
        {
            "iteration": table["iteration"].to_numpy(dtype=np.int64),
            "kind": table["kind"].to_numpy(dtype=object),
            "num_decode_requests": n_dec,
            "sum_decode_kv_tokens": kv_dec,
            "mean_decode_context": mean_context,
            "num_prefill_requests": n_pre,
            "num_prefill_tokens": tok_pre,
            "sum_prefill_kv_tokens": kv_pre,
            "measured_s": measured,
            "simulated_s": simulated,
            "error_pct": error,
        },
        columns=STEP_CHECK_COLUMNS,
    )
    return out


def iteration_s(
    policy: Policy,
    num_decode: int,
    decode_kv_tokens: int,
    num_prefill: int,
    prefill_tokens: int,
    prefill_kv_tokens: int,
) -> float:
    """Seconds the simulator gives one forward of this composition (module docstring for which functions).

    Args:
        policy: a dense policy of the scenario (its ``compute`` is the step model).
        num_decode, decode_kv_tokens: decode requests and the context they attend, summed (tokens).
        num_prefill, prefill_tokens, prefill_kv_tokens: prefill requests, the tokens computed for them and the KV
            they read without computing (tokens), split evenly between them.

    Raises:
        ValueError: an empty composition (no request).
    """
    compute = policy.compute
    chunks = _even_chunks(num_prefill, prefill_tokens, prefill_kv_tokens)
    if num_decode == 0:
        if not chunks:
            raise ValueError("iteration_s: an iteration needs at least one decode or prefill request")
        return compute.prefill_s(chunks, len(chunks))
    extra_s = compute.prefill_extra_s(chunks, len(chunks)) if chunks else 0.0
    ctx = np.full(num_decode, decode_kv_tokens // num_decode, dtype=np.int64)
    ctx[: decode_kv_tokens % num_decode] += 1  # sums to the recorded context
    _, layer_s = policy.recall_free_step(ctx)
    return idle_step_s(
        compute.step_overhead_s + extra_s,
        [layer_s] * compute.num_layers,
        compute.decode_head_s(num_decode),
        compute.overlapped_host_s(num_decode),
    )


def _even_chunks(requests: int, tokens: int, kv_tokens: int) -> list[tuple[int, int]]:
    """``(new_tokens, cached_tokens)`` per prefill request: the totals split as evenly as integers allow."""
    if requests <= 0:
        return []
    new_q, new_r = divmod(tokens, requests)
    kv_q, kv_r = divmod(kv_tokens, requests)
    return [(new_q + (i < new_r), kv_q + (i < kv_r)) for i in range(requests)]


def _dense_policy(scenario: Scenario, name: str | None) -> Policy:
    """The scenario's policy ``name`` (default: its first dense one), checked to be dense."""
    if name is None:
        name = next((n for n, p in scenario.policy.items() if p.kind == "dense"), None)
        if name is None:
            raise ValueError(f"step_check: the scenario has no dense policy (it has {list(scenario.policy)})")
    if name not in scenario.policy:
        raise ValueError(f"step_check: policy {name!r} is not in the scenario (it has {list(scenario.policy)})")
    if scenario.policy[name].kind != "dense":
        raise ValueError(f"step_check: policy {name!r} is {scenario.policy[name].kind!r}; expected a dense policy")
    return make_policy(scenario, name)


def step_check_summary(table: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Error statistics of a :func:`step_check` table, over all iterations and per kind.

    Returns:
        ``{"all" | "decode_only" | "mixed" | "prefill_only": {...}}``, each with ``count``, ``mape_pct`` (mean of
        |error_pct|), ``mean_error_pct`` (signed: > 0 the simulator is slower), ``p10_error_pct``,
        ``p50_error_pct``, ``p90_error_pct`` and ``total_error_pct`` (summed simulated against summed measured
        seconds); NaN statistics for a kind with no iteration. Iterations with a non-finite error are not counted.
    """
    out: dict[str, dict[str, Any]] = {}
    for kind in ("all", *KINDS):
        rows = table if kind == "all" else table[table["kind"] == kind]
        error = rows["error_pct"].to_numpy(dtype=np.float64)
        ok = np.isfinite(error)
        error = error[ok]
        stats: dict[str, Any] = {"count": int(ok.sum())}
        if len(error):
            measured = rows["measured_s"].to_numpy(dtype=np.float64)[ok].sum()
            simulated = rows["simulated_s"].to_numpy(dtype=np.float64)[ok].sum()
            stats["mape_pct"] = float(np.mean(np.abs(error)))
            stats["mean_error_pct"] = float(np.mean(error))
            for p in SUMMARY_PERCENTILES:
                stats[f"p{p}_error_pct"] = float(np.percentile(error, p))
            stats["total_error_pct"] = float((simulated - measured) / measured * 100.0)
        else:
            names = ["mape_pct", "mean_error_pct", *(f"p{p}_error_pct" for p in SUMMARY_PERCENTILES), "total_error_pct"]
            stats.update(dict.fromkeys(names, math.nan))
        out[kind] = stats
    return out


__all__ = ["STEP_CHECK_COLUMNS", "iteration_s", "step_check", "step_check_summary"]

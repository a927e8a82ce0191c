"""Cross-section checks: knob values that each section accepts alone but that cannot work together.

A policy's token windows are bounded by the model's context, its look-ahead by the model's depth, and an
offloading policy must be able to offload at least one request on the given host. :func:`geometry_problems`
lists every violation as ``key: value ... bound`` (one line each); the :class:`sim.config.Scenario` validator
raises the first, so the loader reports it as one line and the CLI exits with status 2.

Sizes are checked before allocation too: :func:`synthetic_size_problem` refuses a synthetic workload whose
requests cannot fit in this machine's available memory (:func:`available_memory_bytes`), with the estimate.
"""

from __future__ import annotations

import os

from sim.config.cards import HardwareSpec, ModelSpec
from sim.config.policy import DensePolicy, OffloadPolicy

GIB = 2**30


def geometry_problems(model: ModelSpec, hardware: HardwareSpec, policies: dict[str, DensePolicy]) -> list[str]:
    """Every impossible policy geometry of a scenario, one line each (empty when all can run).

    Checks, per offload policy ``name``:

    - ``budget_tokens``, ``sink_tokens`` and ``recent_tokens`` ≤ ``model.max_seq_len`` (tokens): a window
      larger than any context is never filled, so the knob would silently mean "everything";
    - ``lookahead_layers`` ≤ ``model.num_layers``: recalls cannot be issued further ahead than the model is
      deep;
    - ``offload_threshold_tokens`` ≤ ``model.max_seq_len``: no request could ever reach the threshold;
    - ``offload_threshold_tokens × model.kv_bytes_per_token`` ≤ ``hardware.host_dram_bytes``: the smallest
      request the policy offloads must fit in host DRAM, else every request would silently run dense
      (admission keeps a request on the GPU when the host cannot hold its KV, sim/serving/admission.py).
    """
    problems: list[str] = []
    for name, spec in policies.items():
        if not isinstance(spec, OffloadPolicy):
            continue
        key = f"policy.{name}"
        for knob in ("budget_tokens", "sink_tokens", "recent_tokens", "offload_threshold_tokens"):
            value = getattr(spec, knob)
            if value > model.max_seq_len:
                problems.append(
                    f"{key}.{knob}: {value} tokens exceeds the model's context "
                    f"(model.max_seq_len = {model.max_seq_len} for {model.name})"
                )
        if spec.lookahead_layers > model.num_layers:
            problems.append(
                f"{key}.lookahead_layers: {spec.lookahead_layers} exceeds the model's depth "
                f"(model.num_layers = {model.num_layers} for {model.name})"
            )
        smallest_bytes = spec.offload_threshold_tokens * model.kv_bytes_per_token
        if smallest_bytes > hardware.host_dram_bytes:
            problems.append(
                f"{key}.offload_threshold_tokens: the smallest offloaded request ({spec.offload_threshold_tokens} "
                f"tokens × {model.kv_bytes_per_token} KV bytes/token = {smallest_bytes / GIB:.2f} GiB) does not "
                f"fit in hardware.host_dram_gib = {hardware.host_dram_gib} GiB, so the policy could never offload; "
                "raise host_dram_gib or lower offload_threshold_tokens"
            )
    return problems


BYTES_PER_SIMULATED_REQUEST = 4096  # generous: ~1.1 KiB measured (README, "Sizes checked before allocation")


def available_memory_bytes() -> int:
    """Memory this machine can still give a process: ``MemAvailable`` of /proc/meminfo (Linux), else free
    physical pages × page size (``os.sysconf``); a very large number where neither is known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 2**62


def synthetic_size_problem(num_requests: int) -> str | None:
    """A one-line refusal when ``num_requests`` synthetic requests cannot be generated and simulated in this
    machine's available memory (estimate: :data:`BYTES_PER_SIMULATED_REQUEST` each), else None."""
    need = num_requests * BYTES_PER_SIMULATED_REQUEST
    have = available_memory_bytes()
    if need <= have:
        return None
    return (
        f"{num_requests} requests need about {need / GIB:,.1f} GiB to generate and simulate "
        f"(~{BYTES_PER_SIMULATED_REQUEST} B each) but this machine has {have / GIB:,.1f} GiB available; "
        f"use at most {have // BYTES_PER_SIMULATED_REQUEST} (or set workload.max_requests on a trace)"
    )

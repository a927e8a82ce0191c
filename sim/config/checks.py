"""Cross-section checks: knob values that each section accepts alone but that cannot work together.

A policy's token windows are bounded by the model's context, its look-ahead by the model's depth, and an
offloading policy must be able to offload at least one request on the given host. :func:`geometry_problems`
lists every violation as ``key: value ... bound`` (one line each); the :class:`sim.config.Scenario` validator
raises the first, so the loader reports it as one line and the CLI exits with status 2.

Sizes are checked before allocation too: :func:`synthetic_size_problem` refuses a synthetic workload whose
requests cannot fit in this machine's available memory (:func:`available_memory_bytes`), with the estimate.

Physical ranges: :func:`hardware_problems` refuses rates and per-call latencies outside what any real device has
(:data:`RATE_RANGES`, :data:`LATENCY_US_MAX`), and :func:`clock_problem` a workload whose simulated clock would
run so far past its shortest step that float64 seconds stop resolving it (:data:`CLOCK_EXACT_STEPS`); the run
calls it once the arrivals and the compute model are known (sim/metrics/physics.py ``check_clock``).
"""

from __future__ import annotations

import math
import os

from sim.config.cards import HardwareSpec, ModelSpec
from sim.config.parallel import per_gpu_hardware, shard_model
from sim.config.policy import DensePolicy, OffloadPolicy

GIB = 2**30


def geometry_problems(
    model: ModelSpec, hardware: HardwareSpec, policies: dict[str, DensePolicy], tp_size: int = 1
) -> list[str]:
    """Every impossible hardware figure or policy geometry of a scenario, one line each (empty when all can run).

    First :func:`hardware_problems` (a card out of range is reported alone: the sizes below would mean nothing);
    then, per offload policy ``name``, :func:`recall_cache_problem` (on the card as one GPU of a ``tp_size``
    group sees it) and:

    - ``budget_tokens``, ``sink_tokens`` and ``recent_tokens`` ≤ ``model.max_seq_len`` (tokens): a window
      larger than any context is never filled, so the knob would silently mean "everything";
    - ``lookahead_layers`` ≤ ``model.num_layers``: recalls cannot be issued further ahead than the model is
      deep;
    - ``offload_threshold_tokens`` ≤ ``model.max_seq_len``: no request could ever reach the threshold;
    - ``offload_threshold_tokens × model.kv_bytes_per_token`` ≤ ``hardware.host_dram_bytes``: the smallest
      request the policy offloads must fit in host DRAM, else every request would silently run dense
      (admission keeps a request on the GPU when the host cannot hold its KV, sim/serving/admission.py).
    """
    problems = hardware_problems(hardware)
    if problems:
        return problems
    gpu_model, gpu_hardware = shard_model(model, tp_size), per_gpu_hardware(hardware, tp_size)
    for name, spec in policies.items():
        if not isinstance(spec, OffloadPolicy):
            continue
        key = f"policy.{name}"
        cache = recall_cache_problem(name, spec, gpu_model, gpu_hardware)
        if cache:
            problems.append(cache)
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


# Rates a scenario may give, (least, most): below the least a device is not plausible hardware, above the most
# no device comes near (HBM3e is 4.8-8 TB/s, PCIe Gen5 x16 64 GB/s, an H200 989 dense TFLOP/s). Calibration floors
# its fits at 1e-3 GB/s and 1e-6 TFLOP/s (calibrate/run.py), so those stay accepted.
GBPS_RANGE = (1e-3, 1e5)  # 1 MB/s .. 100 TB/s
RATE_RANGES: dict[str, tuple[float, float]] = {
    "hbm_bandwidth_gbps": GBPS_RANGE,
    "bf16_tflops": (1e-6, 1e5),  # 1 MFLOP/s .. 100 PFLOP/s
    "h2d_bandwidth_gbps": GBPS_RANGE,
    "d2h_bandwidth_gbps": GBPS_RANGE,
    "host_gather_gbps_per_thread": GBPS_RANGE,
    "pcie_uplink_gbps": GBPS_RANGE,
    "gpu_gather_gbps": GBPS_RANGE,
    "nvlink_bandwidth_gbps": GBPS_RANGE,
    "host_dram_gbps_per_socket": GBPS_RANGE,
    "fp8_tflops": (1e-6, 1e5),
    "hbm_gib": (1e-3, 1e4),  # memory, GiB: 1 MiB .. 10 TiB per GPU (a B200 has 180 GiB)
    "host_dram_gib": (1e-3, 1e5),  # .. 100 TiB of host DRAM
}
LATENCY_US_MAX = 1e6  # one second for one transfer, call, launch or step overhead
LATENCY_FIELDS = (
    "h2d_latency_us", "h2d_call_us", "host_gather_fragment_us", "h2d_batch_call_us", "h2d_batch_entry_us",
    "gpu_gather_launch_us", "decode_step_overhead_us", "nvlink_latency_us",
)  # fmt: skip


def hardware_problems(hardware: HardwareSpec) -> list[str]:
    """Rates and per-call latencies of the card outside physical ranges, one line each naming the field, the value
    and the range: :data:`RATE_RANGES` (GB/s, TFLOP/s; ``h2d_size_table`` rates too) and ``*_us`` ≤
    :data:`LATENCY_US_MAX`. A rate of 1e-9 GB/s or a latency of 1e300 µs would put the simulated clock where float64
    seconds can no longer tell one chunk or layer from the next, and report impossible numbers."""
    problems = []
    for field, (least, most) in RATE_RANGES.items():
        value = getattr(hardware, field)
        if value is not None and not least <= value <= most:
            problems.append(f"hardware.{field}: {value:g} is outside the physical range [{least:g}, {most:g}]")
    for size, gbps in hardware.h2d_size_table or ():
        if not GBPS_RANGE[0] <= gbps <= GBPS_RANGE[1]:
            problems.append(
                f"hardware.h2d_size_table: {gbps:g} GB/s at {size} bytes is outside the physical range "
                f"[{GBPS_RANGE[0]:g}, {GBPS_RANGE[1]:g}] GB/s"
            )
    for field in LATENCY_FIELDS:
        value = getattr(hardware, field)
        if value > LATENCY_US_MAX:
            problems.append(f"hardware.{field}: {value:g} µs is outside the physical range [0, {LATENCY_US_MAX:g}]")
    return problems


def recall_cache_problem(name: str, spec: OffloadPolicy, model: ModelSpec, hardware: HardwareSpec) -> str | None:
    """A fixed-size shared recall cache (``recall_cache: shared`` with ``recall_cache_gib``) that cannot exist on one
    GPU, else None.

    The replica carves the cache out of the KV pool in whole blocks of ``block_size × model.kv_bytes_per_token``
    bytes (sim/serving/replica.py), so it must be at least one block (smaller, it would hold no fragment and every
    recall would miss) and must leave at least one block of the HBM that weights and reserve leave: that pool is
    the only HBM the policy has for the cache, the resident windows and dense requests.

    Args:
        model, hardware: one GPU's shard and its view of the card (``sim.config.parallel``).
    """
    gib = spec.recall_cache_gib
    if spec.recall_cache != "shared" or gib is None or spec.selection == "all":
        return None  # no cache (selection all keeps none), or one sized by the free pool at each step
    key = f"policy.{name}.recall_cache_gib"
    block_bytes = spec.block_size * model.kv_bytes_per_token
    cache_bytes = gib * GIB
    if cache_bytes < block_bytes:
        return (
            f"{key}: {gib:g} GiB is smaller than one KV block ({spec.block_size} tokens × "
            f"{model.kv_bytes_per_token} B = {block_bytes / GIB:.6g} GiB), so the cache would hold nothing; "
            f"give at least {block_bytes / GIB:.6g} GiB or leave it unset (the pool's free HBM at each step)"
        )
    pool_bytes = hardware.hbm_bytes - hardware.reserve_bytes - model.weight_bytes
    if pool_bytes < block_bytes:
        return None  # the model does not fit at all: the run's CapacityError says so
    most_bytes = (pool_bytes // block_bytes - 1) * block_bytes  # whole blocks, one left for KV
    if -(-int(cache_bytes) // block_bytes) * block_bytes <= most_bytes:
        return None
    return (
        f"{key}: {gib:g} GiB does not fit in the {pool_bytes / GIB:.2f} GiB of HBM left for KV on {hardware.name} "
        f"(hbm_gib {hardware.hbm_gib:g} − reserve {hardware.reserve_bytes / GIB:.2f} − weights "
        f"{model.weight_bytes / GIB:.2f} GiB per GPU); use at most {math.floor(most_bytes / GIB * 100) / 100:.2f} GiB"
    )


# The simulated clock is float64 seconds: it resolves its shortest step (one decode layer) exactly while the clock
# stays below this many of them (2**40 steps leave 12 bits below the step: a 0.02 % error at worst).
CLOCK_EXACT_STEPS = 2**40


def clock_problem(field: str, value: float, clock_s: float, min_layer_s: float, scale: str) -> str | None:
    """A workload whose simulated clock would reach ``clock_s``, beyond :data:`CLOCK_EXACT_STEPS` of the shortest
    modelled step ``min_layer_s``, as one line naming ``field`` and ``value`` and the allowed bound; else None.

    Args:
        field: the scenario key that sets the clock's reach (``workload.time_scale``, ``...rate_per_s``).
        value: its value.
        clock_s: the clock the workload's arrivals reach (seconds; estimated for closed-loop sessions).
        min_layer_s: one decode layer of one request, the least the compute model gives (seconds).
        scale: ``"up"`` when the clock grows with the value (a time scale), ``"down"`` when it shrinks (a rate).
    """
    steps = clock_s / min_layer_s
    if steps < CLOCK_EXACT_STEPS:
        return None
    if not math.isfinite(steps):  # arrivals past float64's range (gaps of 1e308 s)
        return f"{field}: {value:g} puts the simulated clock beyond float64's range ({clock_s:g} s)"
    factor = CLOCK_EXACT_STEPS / steps
    bound = f"at most {value * factor:.3g}" if scale == "up" else f"at least {value / factor:.3g}"
    return (
        f"{field}: {value:g} puts the simulated clock at {clock_s:.3g} s, {steps:.3g} decode-layer steps of "
        f"{min_layer_s:.3g} s (the shortest the compute model gives); float64 seconds resolve a step only below "
        f"2**40 = {CLOCK_EXACT_STEPS:.3g} of them: use {bound}"
    )


BYTES_PER_SIMULATED_REQUEST = 4096  # generous: ~1.1 KiB measured (docs/usage.md, "Refused inputs")


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

"""Tensor parallelism: what one GPU of a ``serving.tp_size``-way replica holds, computes and moves.

A replica of ``tp`` GPUs serves one model as SGLang's tensor parallelism does (Megatron-style sharding,
docs/sources.md §5.5):

* **Attention**: query heads split ``num_heads / tp`` per GPU; KV heads split ``num_kv_heads / tp`` per GPU,
  or, when ``tp`` exceeds them, one KV head per GPU, each replicated ``tp / num_kv_heads`` times (SGLang's
  ``QKVParallelLinear``: ``num_kv_head_replicas``). SGLang requires ``num_heads % tp == 0`` and either
  ``num_kv_heads % tp == 0`` or ``tp % num_kv_heads == 0``; so does :func:`shard_model`.
* **MLP**: the SwiGLU width (dense, or every expert's for an MoE) split ``/ tp`` (ceil). MoE runs as
  tensor-parallel experts (SGLang's default without ``--ep-size``); expert parallelism is not modelled.
* **Embedding and LM head**: vocabulary-parallel, ``vocab_size / tp`` rows per GPU (ceil).

So :func:`shard_model` returns the model as one GPU sees it: its KV bytes per token, weight bytes and FLOPs
are that GPU's share, and everything downstream (KV pool, compute roofline, recall bytes of an offloaded
request's own KV heads, host DRAM) is per GPU. :func:`per_gpu_hardware` gives the card as one GPU of the
group sees it: SGLang's reserve grows by ``reserve_per_tp_gib`` per extra GPU ((12 + tp/2) GB on H200,
docs/sources.md §5.1), and the host path is shared (:func:`host_share`): the PCIe switch's uplink by the recalling
GPUs behind it (``gpus_per_pcie_switch``), the socket's DRAM by those on it (``host_dram_gbps_per_socket``), the
recalling GPUs being the group's ranks and, in a fleet, the other replicas of the node (``replicas_sharing_node``).
A lone GPU at ``tp == 1`` gets its argument back unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.config.cards import HardwareSpec, ModelSpec

TP_SIZES = (1, 2, 4, 8)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def shard_error(model: ModelSpec, tp: int) -> str:
    """Why ``model`` cannot be split ``tp`` ways as SGLang splits it ('' if it can)."""
    if model.num_heads % tp:
        return f"num_heads ({model.num_heads}) of model {model.name} must be a multiple of tp_size ({tp})"
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        return f"num_kv_heads ({model.num_kv_heads}) of model {model.name} and tp_size ({tp}) must divide one another"
    return ""


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads one GPU holds: ``num_kv_heads / tp``, at least 1 (replicated when ``tp`` > ``num_kv_heads``)."""
    return max(1, model.num_kv_heads // tp)


def shard_model(model: ModelSpec, tp: int) -> ModelSpec:
    """The model as one GPU of a ``tp``-way tensor-parallel replica holds it (``model`` itself for ``tp`` 1).

    Raises:
        ValueError: if the heads cannot be split ``tp`` ways (:func:`shard_error`).
    """
    if tp == 1:
        return model
    reason = shard_error(model, tp)
    if reason:
        raise ValueError(reason)
    return model.model_copy(
        update={
            "num_heads": model.num_heads // tp,
            "num_kv_heads": kv_heads_per_gpu(model, tp),
            "intermediate_size": _ceil_div(model.intermediate_size, tp),
            "expert_intermediate_size": _ceil_div(model.expert_intermediate_size, tp),
            "shared_expert_intermediate_size": _ceil_div(model.shared_expert_intermediate_size, tp),
            "vocab_size": _ceil_div(model.vocab_size, tp),
        }
    )


@dataclass(frozen=True)
class HostShare:
    """One GPU's share of its node's host path (:func:`host_share`): rates in GB/s (1e9 B/s) and the GPUs sharing.

    Attributes:
        h2d_gbps, d2h_gbps: the copy rates per direction, min(link, uplink / on_switch, socket DRAM / on_socket).
        gather_gbps: the host gather's cap, socket DRAM / (2 · on_socket) (None: no DRAM figure on the card).
        on_switch, on_socket: recalling GPUs behind this GPU's PCIe switch, on its CPU socket (this one included).
    """

    h2d_gbps: float
    d2h_gbps: float
    gather_gbps: float | None
    on_switch: int
    on_socket: int


def host_share(hardware: HardwareSpec, tp: int = 1) -> HostShare:
    """One GPU's share of the host path when the node's recalling GPUs share it (docs/design.md §8)::

        active    = min(gpus_per_node, tp × replicas_sharing_node)   GPUs of the node recalling at once
        on_switch = min(gpus_per_pcie_switch, active),  on_socket = min(gpus_per_socket, active)
        copy rate = min(link, uplink / on_switch, socket DRAM / on_socket)    (per direction; a copy crosses DRAM once)
        gather    ≤ socket DRAM / (2 · on_socket)                             (reads and writes each byte)

    Model assumptions: a replica's ``tp`` ranks recall at once, each its KV-head shard, and with the node's other
    replicas (``replicas_sharing_node``, set by a fleet; worst case: all at once) are packed in order onto switches
    and sockets, this replica first — so it shares the fullest switch and socket. The uplink is ``pcie_uplink_gbps``
    (None: the GPU's own link rate). A lone GPU (``active`` = 1) keeps its link; its gather is capped only by its
    socket's DRAM (half of ``host_dram_gbps_per_socket``). The effective recall rate of gather-scatter is the
    slower of copy and gather: min(link, uplink / on_switch, DRAM / (2 · on_socket)) when threads do not bind.
    """
    active = min(hardware.gpus_per_node, tp * hardware.replicas_sharing_node)
    on_switch, on_socket = min(hardware.gpus_per_pcie_switch, active), min(hardware.gpus_per_socket, active)
    dram = hardware.host_dram_gbps_per_socket

    def copy_gbps(link: float) -> float:
        uplink = hardware.pcie_uplink_gbps if hardware.pcie_uplink_gbps is not None else link
        rate = min(link, uplink / on_switch)
        return rate if dram is None else min(rate, dram / on_socket)

    gather = None if dram is None else dram / (2 * on_socket)
    return HostShare(
        copy_gbps(hardware.h2d_bandwidth_gbps), copy_gbps(hardware.d2h_bandwidth_gbps), gather, on_switch, on_socket
    )


def per_gpu_hardware(hardware: HardwareSpec, tp: int) -> HardwareSpec:
    """The card as one GPU of a ``tp``-GPU group sees it (``hardware`` itself when it shares nothing).

    * Its share of the host path, :func:`host_share`: H2D and D2H rates; where sharing lowers the H2D rate, the GPU
      gather kernel's rate and every measured size-table rate capped at it (they cross the same PCIe); one gather
      thread's rate
      capped so the GPU's gather stays within its share of the socket's DRAM.
    """
    share = host_share(hardware, tp)
    per_thread = hardware.host_gather_gbps_per_thread
    if share.gather_gbps is not None:
        per_thread = min(per_thread, share.gather_gbps / hardware.host_gather_threads)
    # what sharing takes off the H2D rate also caps the GPU gather kernel and a measured size table (not their own rate)
    cap = share.h2d_gbps if share.h2d_gbps < hardware.h2d_bandwidth_gbps else float("inf")
    table = hardware.h2d_size_table
    update = {
        "h2d_bandwidth_gbps": share.h2d_gbps,
        "d2h_bandwidth_gbps": share.d2h_gbps,
        "gpu_gather_gbps": min(hardware.gpu_gather_gbps, cap),
        "host_gather_gbps_per_thread": per_thread,
        "h2d_size_table": None if table is None else [(size, min(gbps, cap)) for size, gbps in table],
    }
    if all(getattr(hardware, key) == value for key, value in update.items()):
        return hardware  # nothing shared: the card itself (its numbers, exactly)
    return hardware.model_copy(update=update)


def allreduce_s(message_bytes: float, tp: int, bandwidth_gbps: float, latency_us: float) -> float:
    """Seconds of one ring all-reduce of ``message_bytes`` over ``tp`` GPUs (0 for ``tp`` 1)::

        t = 2 (tp − 1) / tp · message_bytes / bandwidth + 2 (tp − 1) · latency

    Each GPU sends and receives 2 (tp − 1) / tp of the message (reduce-scatter, then all-gather) in
    2 (tp − 1) steps, each paying the per-step latency (NCCL ring algorithm, docs/sources.md §3.5).
    """
    if tp <= 1:
        return 0.0
    steps = 2 * (tp - 1)
    return steps / tp * message_bytes / (bandwidth_gbps * 1e9) + steps * latency_us * 1e-6

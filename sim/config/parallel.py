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
docs/sources.md §5.1), the host link is shared by the group's GPUs behind one PCIe switch
(``gpus_per_pcie_switch``) and host gather by those on one socket (``host_dram_gbps_per_socket``).
With ``tp == 1`` both return their argument unchanged (today's numbers, exactly).
"""

from __future__ import annotations

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
            "vocab_size": _ceil_div(model.vocab_size, tp),
        }
    )


def per_gpu_hardware(hardware: HardwareSpec, tp: int) -> HardwareSpec:
    """The card as one GPU of a ``tp``-GPU group sees it (``hardware`` itself for ``tp`` 1).

    * ``reserve_gib`` + ``reserve_per_tp_gib`` × (tp − 1): SGLang's reserve (c + tp/2) GB (docs/sources.md §5.1).
    * H2D/D2H rates ÷ min(tp, ``gpus_per_pcie_switch``): the group's GPUs recall in the same step and share
      a switch's uplink (Model assumption: GPUs of a group are packed onto switches).
    * One gather thread's rate capped so the group's gathers on one socket stay within
      ``host_dram_gbps_per_socket`` (read + write: each gathered byte crosses DRAM twice).
    """
    if tp == 1:
        return hardware
    link_share = min(tp, hardware.gpus_per_pcie_switch)
    per_thread = hardware.host_gather_gbps_per_thread
    if hardware.host_dram_gbps_per_socket is not None:
        on_socket = min(tp, hardware.gpus_per_socket)
        cap = hardware.host_dram_gbps_per_socket / (2 * on_socket * hardware.host_gather_threads)
        per_thread = min(per_thread, cap)
    return hardware.model_copy(
        update={
            "reserve_gib": hardware.reserve_gib + hardware.reserve_per_tp_gib * (tp - 1),
            "h2d_bandwidth_gbps": hardware.h2d_bandwidth_gbps / link_share,
            "d2h_bandwidth_gbps": hardware.d2h_bandwidth_gbps / link_share,
            "host_gather_gbps_per_thread": per_thread,
        }
    )


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

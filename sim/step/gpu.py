"""One GPU of a replica: its shard of the model's weights and KV, the card as it sees it, and every PCIe transfer it
makes, charged through :class:`~sim.step.link.LinkModel` on the replica's queues (docs/design.md §8).

What one GPU of a ``serving.tp_size``-way replica holds and sees (sim/config/parallel.py): ``model`` is its shard
(:func:`~sim.config.parallel.shard_model`: its KV heads, so its KV bytes per token, weight bytes and FLOPs, in the
model's dtypes) and ``hardware`` the card as it sees it (:func:`~sim.config.parallel.per_gpu_hardware`: its TP
reserve, its share of the host path). At ``tp_size`` 1 they are the scenario's own model and card.

Transfers (one H2D and one D2H DMA queue per GPU, sim/step/timing.py ``StepDevices``: copy engines are per direction,
docs/sources.md §3.2):

============================  =========  ===========================================================================
transfer                      queue      seconds
============================  =========  ===========================================================================
recall of offloaded KV        H2D        the policy's step cost (sim/policies/offload.py, :attr:`GpuView.link`)
eager per-token backups       D2H        the policy's step cost (``DecodeRun.d2h_bytes``, queued by each step)
prompt write-back (colocated  D2H        :meth:`GpuView.write_back`: ``LinkModel.d2h_s`` of the shard's bytes
prefill of offloaded prompts)
HiCache write-through         D2H        :meth:`GpuView.write_through`: ``LinkModel.d2h_s``
swap-out (``retract: swap``)  D2H        :meth:`GpuView.swap_out`: ``LinkModel.d2h_s``
swap-in (resume)              H2D        :meth:`GpuView.swap_in`: :meth:`GpuView.load_s`
HiCache reload                H2D        :meth:`GpuView.hicache_load`: :meth:`GpuView.load_s`
============================  =========  ===========================================================================

Every queued transfer is FIFO on its queue: a D2H one waits behind the backups and writes queued before it (and
while the D2H queue is busy, H2D copies slow down by the card's ``d2h_coupling``); an H2D one waits behind the
recall work the link has queued (``link_free_s``), and a recall queued after it waits for it. A load of host KV
(swap-in, HiCache reload) is one contiguous copy per layer (*model assumption*: the KV pool is one buffer per
layer, so a request's or a prefix's KV of one layer is copied as one transfer), so it pays the link's per-copy
latency (or its measured size curve) once per layer. D2H copies are charged at the D2H rate alone (few, large
copies: ``LinkModel.d2h_s``).
"""

from __future__ import annotations

import numpy as np

from sim.config import HardwareSpec, ModelSpec, Scenario
from sim.config.parallel import per_gpu_hardware, shard_model
from sim.step.link import LinkModel
from sim.step.timing import StepDevices


class GpuView:
    """One GPU of a replica (module docstring): its model shard, its card, its link, and its transfers.

    Args:
        model: the model card (the whole model); hardware: the card (as the node gives it to the replica).
        tp_size: GPUs in the replica's tensor-parallel group (``serving.tp_size``).
    """

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, tp_size: int = 1) -> None:
        self.tp_size = tp_size
        self.model = shard_model(model, tp_size)  # one GPU's shard (the model itself at tp_size 1)
        self.hardware = per_gpu_hardware(hardware, tp_size)  # the card as one GPU sees it
        self.link = LinkModel(self.hardware)  # its share of the host path
        self.kv_bytes_per_token = self.model.kv_bytes_per_token  # this GPU's KV heads, all layers
        self.num_layers = self.model.num_layers

    @classmethod
    def of(cls, scenario: Scenario) -> GpuView:
        """The view of one GPU of ``scenario``'s replicas."""
        return cls(scenario.model, scenario.hardware, scenario.serving.tp_size)

    def kv_bytes(self, tokens: float) -> float:
        """This GPU's KV bytes of ``tokens`` tokens (all layers)."""
        return tokens * self.kv_bytes_per_token

    # ---- seconds (no queue) ------------------------------------------------------------------------
    def load_s(self, tokens: float) -> float:
        """Link seconds to load ``tokens`` tokens of this GPU's KV from host: one contiguous copy per layer
        (``LinkModel.copies_s``, latency or size curve included), before any D2H slowdown."""
        if tokens <= 0:
            return 0.0
        per_layer = np.array([self.kv_bytes(tokens) / self.num_layers])
        return self.num_layers * float(self.link.copies_s(per_layer)[0])

    def store_s(self, tokens: float) -> float:
        """D2H seconds to write ``tokens`` tokens of this GPU's KV to host (``LinkModel.d2h_s``)."""
        return self.link.d2h_s(self.kv_bytes(tokens))

    # ---- transfers on the replica's queues ---------------------------------------------------------
    def write_back(self, devices: StepDevices, now_s: float, tokens: float) -> float:
        """Queue on the D2H queue at ``now_s`` the prompt KV a colocated prefill computed for offloaded requests
        (``tokens`` tokens, this GPU's shard); return its seconds."""
        return devices.queue_d2h(now_s, self.kv_bytes(tokens))

    def write_through(self, devices: StepDevices, now_s: float, tokens: float) -> float:
        """Queue on the D2H queue at ``now_s`` HiCache's write-through of ``tokens`` tokens of new prefix nodes
        (this GPU's shard); return its seconds."""
        return devices.queue_d2h(now_s, self.kv_bytes(tokens))

    def swap_out(self, devices: StepDevices, now_s: float, tokens: float) -> float:
        """Queue on the D2H queue at ``now_s`` the offload of a retracted request's ``tokens`` KV tokens; return when
        the copy ends (behind the D2H work queued before it)."""
        devices.queue_d2h(now_s, self.kv_bytes(tokens))
        return devices.d2h_free_s if tokens > 0 else now_s

    def swap_in(self, devices: StepDevices, now_s: float, tokens: float) -> float:
        """Queue on the link at ``now_s`` the load of a resumed request's ``tokens`` KV tokens; return when the
        copy ends (behind the H2D work queued before it)."""
        if tokens <= 0:
            return now_s
        devices.queue_h2d(now_s, self.load_s(tokens))
        return devices.link_free_s

    def hicache_load(self, devices: StepDevices, now_s: float, tokens: float) -> tuple[float, float]:
        """Queue on the link at ``now_s`` HiCache's reload of ``tokens`` host-tier prefix tokens, which the prefill
        forward overlaps layer by layer (sim/serving/prefix.py ``reload_forward_s``); returns (seconds from
        ``now_s`` until the load starts: the link's queued work, the load's link seconds)."""
        if tokens <= 0:
            return 0.0, 0.0
        start_s = max(now_s, devices.link_free_s)
        seconds = devices.queue_h2d(now_s, self.load_s(tokens))
        return start_s - now_s, seconds

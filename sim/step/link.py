"""The I/O path of a recall as its parts: host gather, the H2D link, a GPU gather kernel; bytes → seconds.

Link (one H2D DMA queue per GPU; copy engines are per direction, docs/sources.md §3.2). One transfer of
``s`` bytes takes::

    t(s) = t0 + s / BW                       (hardware card: h2d_latency_us, h2d_bandwidth_gbps), or
    t(s) = s / BW(s)                         with BW(s) log-interpolated in a measured size→GB/s table
                                             (h2d_size_table; sizes outside the table take the nearest
                                             point's rate)

Per layer, by the link mode (:data:`LINK_IO_MODES`: the policy's ``io``, or ``streamed`` for its gather-scatter
under the interruptible pipeline; N fragments, ``bytes`` in all):

* ``per_fragment`` — one ``cudaMemcpyAsync`` per fragment: N · max(c, t(bytes / N)), where c =
  ``h2d_call_us`` is the host-side cost of issuing one copy, serial on the issuing thread (docs/sources.md
  §3.3: 3.45–3.98 µs per call on H100, torchcomms PR #2195; ~5.5 µs per copy in vLLM PR #40549's loop), and
  t0 ≈ 1.2 µs the pipelined per-descriptor DMA cost. Small fragments are bound by c: 8 KiB runs at ~2 GB/s
  (SparseServe: < 5 GB/s for per-block memcpy).
* ``batched`` — one call for all fragments (as ``cudaMemcpyBatchAsync``): call + N · entry + bytes / BW
  (h2d_batch_call_us, h2d_batch_entry_us; §3.3: 2.23–2.53 µs per entry on H100, torchcomms PR #2195).
* ``gather_scatter`` — host gather into a pinned staging buffer, then one copy t(bytes).
* ``streamed`` — gather-scatter in chunks of ``chunk_bytes``: the host gathers chunk j+1 while the link
  copies chunk j (the interruptible schedule). The job completes after
  ``t0 + max(g, body) + first · min(g, body)`` (body = copy − t0, first = chunk share of the first
  chunk, which cannot overlap), but only the copy is link time (see :meth:`LinkModel.streamed_s`).
* ``gpu_gather`` — a kernel on the GPU reads pinned host memory (UVA zero-copy): no host gather, no
  staging copy: launch + (bytes + N · half) / BW_gg, i.e. a fragment of s bytes runs at
  BW_gg · s / (s + half). It crosses PCIe, so it counts as link time; its SM cost is the policy's
  (sim/policies/offload.py). §3.2: > 20 GB/s on Gen4 (SparseServe), ~35 GB/s SM-driven on Hopper.

Host gather (the host-gather resource: CPU threads and host memory bandwidth)::

    g(N, bytes) = N · fragment_cost / threads + bytes / (threads · per_thread_rate)

The card handed in is the GPU's view of it (sim/config/parallel.py ``per_gpu_hardware``), its rates already its
share of the node's host path (``host_share``: the PCIe switch's uplink divided among the recalling GPUs behind it,
the socket's DRAM among those on it, the per-thread gather rate capped at its DRAM share; a lone GPU keeps its
card's rates). This module only turns those rates into seconds.

D2H (one D2H DMA queue per GPU, sim/step/timing.py): while offload writes keep it busy for a fraction f
of a step, H2D transfers run ``1 / (1 − coupling · f)`` times longer (0–55 % slowdowns measured,
docs/sources.md §3.2).
"""

from __future__ import annotations

import numpy as np

from sim.config import HardwareSpec
from sim.config.policy import IO_MODES
from sim.step.pipeline import h2d_slowdown


def table_copy_s(sizes: np.ndarray, log_sizes: np.ndarray, table_bps: np.ndarray) -> np.ndarray:
    """Seconds of one copy of each size (bytes, > 0) at the rate log-interpolated in a measured size table
    (``log_sizes`` = log of its sizes, ``table_bps`` its rates in B/s; nearest point's rate outside it)."""
    return sizes / np.interp(np.log(sizes), log_sizes, table_bps)


# How the link model charges a layer's recall: a policy's ``io`` (sim.config.policy.IO_MODES), or ``streamed``
# (gather-scatter in chunks, what ``gather_scatter`` becomes under the interruptible pipeline).
LINK_IO_MODES: tuple[str, ...] = (*IO_MODES, "streamed")


class LinkModel:
    """Per-layer times of the I/O path for one GPU.

    Args:
        hardware: the card (link bandwidth and per-transfer cost, optional size table, batched-copy and
            GPU-gather costs, host gather parameters, D2H bandwidth and coupling).
    """

    def __init__(self, hardware: HardwareSpec) -> None:
        self.bps = hardware.h2d_bandwidth_gbps * 1e9
        self.t0_s = hardware.h2d_latency_us * 1e-6
        self.call_s = hardware.h2d_call_us * 1e-6
        table = hardware.h2d_size_table
        self.log_sizes = np.log([size for size, _ in table]) if table else None
        self.table_bps = np.array([gbps * 1e9 for _, gbps in table]) if table else None
        self.gather_threads = hardware.host_gather_threads
        self.gather_bps = self.host_gather_bps(hardware)
        self.gather_fragment_s = hardware.host_gather_fragment_us * 1e-6
        self.batch_call_s = hardware.h2d_batch_call_us * 1e-6
        self.batch_entry_s = hardware.h2d_batch_entry_us * 1e-6
        self.gg_bps = hardware.gpu_gather_gbps * 1e9
        self.gg_launch_s = hardware.gpu_gather_launch_us * 1e-6
        self.gg_half_bytes = hardware.gpu_gather_half_bytes
        self.d2h_bps = hardware.d2h_bandwidth_gbps * 1e9
        self.d2h_coupling = hardware.d2h_coupling

    @staticmethod
    def host_gather_bps(hardware: HardwareSpec) -> float:
        """One GPU's host gather rate in B/s: threads × per-thread rate (its share of the socket's DRAM is already
        in the per-thread rate of a shared card, sim/config/parallel.py ``host_share``)."""
        return hardware.host_gather_threads * hardware.host_gather_gbps_per_thread * 1e9

    # The scalar methods below are the per-layer formulas of :meth:`layer_times` for one value, so the
    # tests of these formulas exercise the code the simulator runs.
    def fragments_s(self, num_fragments: float, fragment_bytes: float, io: str = "per_fragment") -> float:
        """Link seconds for ``num_fragments`` fragments of ``fragment_bytes`` each (``per_fragment``,
        ``batched`` or ``gpu_gather``)."""
        return float(self.layer_times([num_fragments * fragment_bytes], [num_fragments], io)[1][0])

    def layer_times(
        self, nbytes: np.ndarray, fragments: np.ndarray, io: str, chunk_bytes: float = 0.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised (host gather seconds, link seconds) for arrays of per-layer recalls (float arrays, same
        shape). Link seconds are the time the transfer itself occupies PCIe (copy, or the gather kernel);
        for ``streamed`` the job's completion is :meth:`streamed_s` of the two.

        Raises:
            ValueError: ``io`` is not one of :data:`LINK_IO_MODES`.
        """
        nbytes = np.asarray(nbytes, dtype=float)
        fragments = np.asarray(fragments, dtype=float)
        some = nbytes > 0
        if io in ("per_fragment", "batched", "gpu_gather"):
            zero, n = np.zeros_like(nbytes), np.maximum(fragments, 1)
        if io == "per_fragment":
            size = np.where(some, nbytes / n, 1.0)
            return zero, np.where(some, fragments * np.maximum(self.call_s, self._one_copy(size)), 0.0)
        if io == "batched":
            return zero, np.where(some, self.batch_call_s + n * self.batch_entry_s + nbytes / self.bps, 0.0)
        if io == "gpu_gather":
            return zero, np.where(some, self.gg_launch_s + (nbytes + n * self.gg_half_bytes) / self.gg_bps, 0.0)
        if io not in ("gather_scatter", "streamed"):
            raise ValueError(f"io={io!r} must be one of {LINK_IO_MODES}")
        gather = np.where(
            some, fragments * self.gather_fragment_s / self.gather_threads + nbytes / self.gather_bps, 0.0
        )
        return gather, self.copies_s(nbytes)

    def streamed_s(self, gather: np.ndarray, copy: np.ndarray, nbytes: np.ndarray, chunk_bytes: float) -> np.ndarray:
        """Completion seconds of streamed gather-scatter jobs (float arrays, same shape): the host gathers
        chunk j+1 while the link copies chunk j, so the job takes ``t0 + max(g, body) + first · min(g, body)``
        where ``body`` = copy − t0 and ``first`` = the first chunk's share of the bytes (no overlap for it).

        Accounting (sim/step/pipeline.py): the link is held for the whole job — a waiting link takes no
        other job except by pre-emption at a chunk boundary — but only ``copy`` counts as link busy time;
        the rest is the link idling on the gather, which counts as gather busy time.
        """
        nbytes = np.asarray(nbytes, dtype=float)
        some = nbytes > 0
        t0 = 0.0 if self.log_sizes is not None else self.t0_s
        body = np.maximum(np.asarray(copy, dtype=float) - t0, 0.0)
        first = np.minimum(1.0, chunk_bytes / np.where(some, nbytes, 1.0))
        return np.where(some, t0 + np.maximum(gather, body) + first * np.minimum(gather, body), 0.0)

    def copies_s(self, sizes: np.ndarray) -> np.ndarray:
        """Seconds for one transfer of each size (float array of bytes; 0 where the size is 0)."""
        sizes = np.asarray(sizes, dtype=float)
        some = sizes > 0
        return np.where(some, self._one_copy(np.where(some, sizes, 1.0)), 0.0)

    def _one_copy(self, size: np.ndarray) -> np.ndarray:
        if self.log_sizes is None:
            return self.t0_s + size / self.bps
        return table_copy_s(size, self.log_sizes, self.table_bps)

    def d2h_s(self, nbytes: float) -> float:
        """Seconds the D2H queue needs for ``nbytes`` of offload writes (bandwidth only: few, large copies)."""
        return nbytes / self.d2h_bps if nbytes > 0 else 0.0

    def d2h_slowdown(self, d2h_busy_s: float, step_s: float) -> float:
        """:func:`sim.step.pipeline.h2d_slowdown` (where the layer pipeline's compiled source lives) on this card's
        coupling."""
        return h2d_slowdown(d2h_busy_s, step_s, self.d2h_coupling)

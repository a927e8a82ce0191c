"""PCIe link and host-gather cost models: bytes and fragment counts → seconds.

Link (one H2D DMA queue per GPU; copy engines are per direction, docs/sources.md §3.2). One transfer of
``s`` bytes takes::

    t(s) = t0 + s / BW                       (hardware card: h2d_latency_us, h2d_bandwidth_gbps), or
    t(s) = s / BW(s)                         with BW(s) log-interpolated in a measured size→GB/s table
                                             (h2d_size_table; sizes outside the table take the nearest
                                             point's rate)

``per_fragment`` I/O pays this per fragment (N·t0 + bytes/BW for N equal fragments); ``gather_scatter``
pays it once for the coalesced transfer. docs/sources.md §3.3: 8 KiB fragments reach ~6 GB/s on a link
whose large copies run at 25–55 GB/s, i.e. t0 ≈ 1.2 µs.

Host gather (gather_scatter only): the CPU copies each fragment from the host pool into the pinned
staging buffer before the H2D copy, ``threads`` threads in parallel::

    g(N, bytes) = (N · fragment_cost + bytes / per_thread_rate) / threads

D2H coupling: while offload writes (D2H) keep their copy engine busy for a fraction f of a step, H2D
transfers run ``1 / (1 − coupling · f)`` times longer (0–55 % slowdowns measured, docs/sources.md §3.2).
"""

from __future__ import annotations

import numpy as np

from sim.config import HardwareSpec


def table_copy_s(sizes: np.ndarray, log_sizes: np.ndarray, table_bps: np.ndarray) -> np.ndarray:
    """Seconds of one copy of each size (bytes, > 0) at the rate log-interpolated in a measured size table
    (``log_sizes`` = log of its sizes, ``table_bps`` its rates in B/s; nearest point's rate outside it)."""
    return sizes / np.interp(np.log(sizes), log_sizes, table_bps)


class LinkModel:
    """H2D transfer times for one GPU.

    Args:
        hardware: the card (bandwidth, per-transfer latency, optional size table, gather parameters).
    """

    def __init__(self, hardware: HardwareSpec) -> None:
        self.bps = hardware.h2d_bandwidth_gbps * 1e9
        self.t0_s = hardware.h2d_latency_us * 1e-6
        table = hardware.h2d_size_table
        self.log_sizes = np.log([size for size, _ in table]) if table else None
        self.table_bps = np.array([gbps * 1e9 for _, gbps in table]) if table else None
        self.gather_threads = hardware.host_gather_threads
        self.gather_bps = hardware.host_gather_gbps_per_thread * 1e9
        self.gather_fragment_s = hardware.host_gather_fragment_us * 1e-6
        self.d2h_bps = hardware.d2h_bandwidth_gbps * 1e9
        self.d2h_coupling = hardware.d2h_coupling

    # The scalar methods below are the per-layer formulas of :meth:`layer_times` for one value, so the
    # tests of these formulas exercise the code the simulator runs.
    def transfer_s(self, size_bytes: float) -> float:
        """Seconds for one transfer of ``size_bytes`` (0 for an empty one)."""
        return float(self.copies_s(np.array([size_bytes], dtype=float))[0])

    def fragments_s(self, num_fragments: float, fragment_bytes: float) -> float:
        """Seconds for ``num_fragments`` separate copies of ``fragment_bytes`` each (per_fragment I/O)."""
        return float(self.layer_times([num_fragments * fragment_bytes], [num_fragments], "per_fragment")[1][0])

    def gather_s(self, num_fragments: float, nbytes: float) -> float:
        """Host seconds to gather ``num_fragments`` fragments totalling ``nbytes`` into the staging buffer."""
        return float(self.layer_times([nbytes], [num_fragments], "gather_scatter")[0][0])

    def layer_times(
        self, nbytes: np.ndarray, fragments: np.ndarray, io: str, chunk_bytes: float = 0.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised (gather seconds, link seconds) for arrays of per-layer recalls (float arrays, same shape).

        ``io``: ``per_fragment`` (equal fragments, one copy each), ``gather_scatter`` (gather, then one
        copy) or ``streamed`` (gather and copy pipelined in chunks of ``chunk_bytes``).
        """
        nbytes = np.asarray(nbytes, dtype=float)
        fragments = np.asarray(fragments, dtype=float)
        some = nbytes > 0
        zero = np.zeros_like(nbytes)
        if io == "per_fragment":
            size = np.where(some, nbytes / np.maximum(fragments, 1), 1.0)
            return zero, np.where(some, fragments * self._one_copy(size), 0.0)
        gather = np.where(
            some, (fragments * self.gather_fragment_s + nbytes / self.gather_bps) / self.gather_threads, 0
        )
        copy = self.copies_s(nbytes)
        if io == "gather_scatter":
            return gather, copy
        t0 = 0.0 if self.log_sizes is not None else self.t0_s
        body = np.maximum(copy - t0, 0.0)
        first = np.minimum(1.0, chunk_bytes / np.where(some, nbytes, 1.0))
        return zero, np.where(some, t0 + np.maximum(gather, body) + first * np.minimum(gather, body), 0.0)

    def copies_s(self, sizes: np.ndarray) -> np.ndarray:
        """Seconds for one transfer of each size (float array of bytes; 0 where the size is 0)."""
        sizes = np.asarray(sizes, dtype=float)
        some = sizes > 0
        return np.where(some, self._one_copy(np.where(some, sizes, 1.0)), 0.0)

    def _one_copy(self, size: np.ndarray) -> np.ndarray:
        if self.log_sizes is None:
            return self.t0_s + size / self.bps
        return table_copy_s(size, self.log_sizes, self.table_bps)

    def d2h_slowdown(self, d2h_bytes: float, step_s: float) -> float:
        """Factor (≥ 1) stretching H2D times in a step of ``step_s`` whose offload writes move ``d2h_bytes``."""
        if d2h_bytes <= 0 or self.d2h_coupling == 0 or step_s <= 0:
            return 1.0
        busy = min(1.0, d2h_bytes / self.d2h_bps / step_s)
        return 1.0 / (1.0 - self.d2h_coupling * busy)

    def achieved_gbps(self, nbytes: float, seconds: float) -> float:
        """Bytes over seconds in GB/s (1e9 B/s); 0 when nothing moved."""
        return nbytes / seconds / 1e9 if seconds > 0 else 0.0

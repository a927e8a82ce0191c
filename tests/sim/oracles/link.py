"""Scalar forms of the link model's per-layer formulas (sim/step/link.py ``LinkModel.layer_times`` and
``copies_s`` for one value), so the tests of these formulas exercise the code the simulator runs."""

from __future__ import annotations

import numpy as np

from sim.step.link import LinkModel


def transfer_s(link: LinkModel, size_bytes: float) -> float:
    """Seconds for one transfer of ``size_bytes`` (0 for an empty one)."""
    return float(link.copies_s(np.array([size_bytes], dtype=float))[0])


def gather_s(link: LinkModel, num_fragments: float, nbytes: float) -> float:
    """Host seconds to gather ``num_fragments`` fragments totalling ``nbytes`` into the staging buffer."""
    return float(link.layer_times([nbytes], [num_fragments], "gather_scatter")[0][0])


def achieved_gbps(nbytes: float, seconds: float) -> float:
    """Bytes over seconds in GB/s (1e9 B/s); 0 when nothing moved."""
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0

"""The Triton kernel of ``gpu_gather`` recall (engine/io.py ``GpuGatherIO``): rows read from pinned host memory.

CUDA: pinned host allocations are mapped into the device address space (UVA), so a kernel can load them over
PCIe with no staging copy and no CPU gather. One program per row (a block's bytes, or one head_dim vector of a
(block, head) fragment) loads the row from the host pool at ``src`` and stores it into the device pool at
``dst``. It runs on the caller's stream and occupies SMs while it runs (the cost the simulator charges as
``hardware.gpu_gather_sm_frac``).
"""

from __future__ import annotations

import torch

try:  # Triton ships with CUDA builds of torch; absent on CPU builds
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the torch build
    triton = None

if triton is not None:

    @triton.jit
    def _gather_rows(src_ptr, dst_ptr, src_idx_ptr, dst_idx_ptr, row_elems, BLOCK: tl.constexpr):  # noqa: N803
        """One program per row: dst[dst_idx[pid]] = src[src_idx[pid]] (rows of ``row_elems`` elements)."""
        pid = tl.program_id(0)
        s = tl.load(src_idx_ptr + pid).to(tl.int64)
        d = tl.load(dst_idx_ptr + pid).to(tl.int64)
        for off in range(0, row_elems, BLOCK):
            cols = off + tl.arange(0, BLOCK)
            mask = cols < row_elems
            tl.store(dst_ptr + d * row_elems + cols, tl.load(src_ptr + s * row_elems + cols, mask=mask), mask=mask)


def available() -> bool:
    """Whether Triton is importable (CUDA builds of torch)."""
    return triton is not None


def gather_rows(host_rows: torch.Tensor, dev_rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> bool:
    """Launch ``dev_rows[dst] = host_rows[src]`` as one kernel on the current stream.

    Args:
        host_rows: [R, E] integer rows of the pinned host pool (CPU, pinned).
        dev_rows: [R', E] rows of the device pool (CUDA), same element type.
        src, dst: int64 [n] row indices (CPU).

    Returns:
        False if Triton is missing or refuses the host pointer (the caller then falls back), else True.
    """
    if triton is None:
        return False
    device = dev_rows.device
    src_dev = src.pin_memory().to(device, non_blocking=True)
    dst_dev = dst.pin_memory().to(device, non_blocking=True)
    row_elems = host_rows.shape[1]
    block = min(1024, triton.next_power_of_2(row_elems))
    try:
        _gather_rows[(src.shape[0],)](host_rows, dev_rows, src_dev, dst_dev, row_elems, BLOCK=block)
    except (RuntimeError, ValueError, TypeError):  # e.g. "Pointer argument cannot be accessed from Triton"
        return False
    return True

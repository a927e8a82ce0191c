"""``gpu_gather`` recall (engine/io.py): a GPU kernel reads the selected rows straight from pinned host memory.

CUDA: pinned host allocations are mapped into the device address space (UVA), so a kernel can load them
over PCIe with no staging copy and no CPU gather. The kernel is a Triton program per row (a block's bytes,
or one head_dim vector of a (block, head) fragment): it loads the row from the host pool at ``src`` and
stores it into the device pool at ``dst``. It runs on the I/O engine's stream and occupies SMs while it
runs, which is the cost the simulator charges (``hardware.gpu_gather_sm_frac``). If Triton is not
installed or refuses the host pointer at the first call, every call falls back to ``gather_scatter``
(CPU gather into a pinned buffer, one copy, device scatter) and ``path`` says so: the results are the same
bytes, but it is not a GPU gather and must not be reported as one.

CPU: the "device" pool is a CPU tensor, so the direct read is one ``index_copy_`` of the host rows into the
device rows (one pass over the bytes, no staging).
"""

from __future__ import annotations

import torch

from engine.io import GatherScatterIO, RecallIO, fragment_rows
from engine.pools import KVPool

try:  # Triton ships with CUDA builds of torch; absent on CPU builds
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the torch build
    triton = None

_ELEM_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8)  # widest that divides a row (Triton has no complex)

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


def _rows(layer: torch.Tensor, row_bytes: int) -> torch.Tensor:
    """The layer's bytes as rows of ``row_bytes`` (a view), typed with the widest integer dividing a row."""
    dtype = next(d for d in _ELEM_DTYPES if row_bytes % d.itemsize == 0)
    return layer.view(-1).view(torch.uint8).view(dtype).view(-1, row_bytes // dtype.itemsize)


class GpuGatherIO(RecallIO):
    """Recall by a GPU kernel reading pinned host memory (CUDA), or one index-copy (CPU). See the module docstring.

    Attributes:
        path: ``"triton_uva"`` (the kernel), ``"gather_scatter_fallback"`` (no usable Triton) or ``"cpu"``.
    """

    mode = "gpu_gather"

    def __init__(self, host_pool: KVPool, device_pool: KVPool) -> None:
        """Raises ValueError if the pools differ (RecallIO) or, on CUDA, the host pool is not pinned."""
        super().__init__(host_pool, device_pool)
        if self.cuda and not host_pool.layers[0].is_pinned():
            raise ValueError("gpu_gather needs a pinned host pool (KVPool(..., pin_memory=True))")
        self.path = "cpu" if not self.cuda else ("triton_uva" if triton is not None else "gather_scatter_fallback")
        self._fallback = GatherScatterIO(host_pool, device_pool) if self.cuda else None

    def _recall(self, layer: int, src_ids: torch.Tensor, dst_slots: torch.Tensor, heads: torch.Tensor | None) -> int:
        if self.path == "gather_scatter_fallback":
            return self._fallback._recall(layer, src_ids, dst_slots, heads)
        if heads is None:
            row_bytes, src_rows, dst_rows = self.host.block_bytes, src_ids, dst_slots
        else:
            p, hkv = self.host.block_size, self.host.num_kv_heads
            row_bytes = self.host.fragment_bytes // (2 * p)
            src_rows, dst_rows = fragment_rows(src_ids, heads, p, hkv), fragment_rows(dst_slots, heads, p, hkv)
        host_rows = _rows(self.host.layers[layer], row_bytes)
        dev_rows = _rows(self.device.layers[layer], row_bytes)
        if not self.cuda:
            dev_rows.index_copy_(0, dst_rows, host_rows.index_select(0, src_rows))
        elif not self._launch(host_rows, dev_rows, src_rows, dst_rows):
            return self._fallback._recall(layer, src_ids, dst_slots, heads)
        return src_rows.shape[0] * row_bytes

    def _launch(self, host_rows: torch.Tensor, dev_rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> bool:
        """Launch the kernel on the current stream; False (and ``path`` set to the fallback) if Triton refuses."""
        device = dev_rows.device
        src_dev = src.pin_memory().to(device, non_blocking=True)
        dst_dev = dst.pin_memory().to(device, non_blocking=True)
        row_elems = host_rows.shape[1]
        block = min(1024, triton.next_power_of_2(row_elems))
        try:
            _gather_rows[(src.shape[0],)](host_rows, dev_rows, src_dev, dst_dev, row_elems, BLOCK=block)
        except (RuntimeError, ValueError, TypeError):  # e.g. "Pointer argument cannot be accessed from Triton"
            self.path = "gather_scatter_fallback"
            return False
        return True

"""The I/O engine: recall (host -> device) of selected KV blocks, behind one interface, and offload.

Protocol, per layer and decode step:
  1. ``recall(layer, src_ids, dst_block_ids, heads)`` copies host blocks ``src_ids`` of that layer into device
     blocks ``dst_block_ids``; with ``heads`` given, only KV head ``heads[i]`` of block ``src_ids[i]`` moves (a
     head-wise fragment). Returns the bytes moved. On CUDA the copies run on the engine's own stream and
     the call returns without waiting for them.
  2. ``wait(layer)`` makes the current (compute) stream wait for that layer's recall: a stream-side wait
     on an event, never a host sync. On CPU both calls are synchronous and ``wait`` does nothing.

Modes (every mode must leave byte-identical pools):
* ``per_fragment`` - one copy per fragment (per block, or per (block, head)): the baseline, deliberately
  naive, one Python-level copy each, as offloaders that issue one cudaMemcpyAsync per fragment do.
* ``gather_scatter`` - index-gather all fragments of the call (in host address order) into a pinned
  staging buffer, one host-to-device copy of it, one index-scatter on the device into the device blocks. A call
  larger than the staging buffer runs as several such chunks through two alternating staging buffers.
* ``gpu_gather`` - a GPU kernel reads the fragments straight from the pinned host pool (UVA zero-copy: a
  pinned allocation's host address is also a device address) and writes them into the slots: no host
  gather, no staging copy, one launch per call; it runs on SMs (what SparseServe's FlashH2D and SGLang's
  transfer kernels do, docs/sources.md §3.2). On CUDA it is a Triton kernel (engine/triton_gather.py); where
  Triton is missing or refuses the host pointer, the call falls back to ``gather_scatter`` (the CPU
  gathers; ``GpuGatherIO.path`` says which ran). On CPU it is one index-copy from the host rows into the
  device rows: the same bytes as ``per_fragment``.

On a CPU-only machine the "device" pool is a separate, preallocated CPU tensor standing in for device
memory. There, per_fragment copies each fragment straight into it, and gather_scatter's copy to the
device and its scatter are one step: an index-scatter from the staging buffer into that tensor. (A
separate device staging buffer would add a third pass over the bytes that, on a GPU, runs at HBM speed
and costs next to nothing beside the PCIe copy, but on a CPU costs as much as the gather.)
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from engine import triton_gather
from engine.pools import KVPool

IO_MODES = ("per_fragment", "gather_scatter", "gpu_gather")
_ROW_DTYPES = (torch.complex128, torch.int64, torch.int32, torch.int16, torch.uint8)  # widest first


def row_view(layer: torch.Tensor, row_bytes: int) -> torch.Tensor:
    """The bytes of a contiguous tensor as rows of `row_bytes`, typed with the widest element that divides a row.

    Hot path: index_select/index_copy_ on CPU cost per element, so a 16-byte element moves a row
    several times faster than the pool's own 2-byte dtype would; the bytes are unchanged.

    Args:
        layer: any contiguous tensor whose byte size is a multiple of row_bytes.
        row_bytes: bytes per row.

    Returns:
        A view [layer_bytes // row_bytes, row_bytes // element_size] sharing layer's memory.
    """
    dtype = next(d for d in _ROW_DTYPES if row_bytes % d.itemsize == 0)
    return layer.view(-1).view(torch.uint8).view(dtype).view(-1, row_bytes // dtype.itemsize)


def fragment_rows(block_ids: torch.Tensor, heads: torch.Tensor, block_size: int, num_kv_heads: int) -> torch.Tensor:
    """Row indices of (block, head) fragments in a pool viewed as rows of one head_dim vector.

    Row (b, kv, t, h) of a [N, 2, P, Hkv, D] pool is ((b * 2 + kv) * P + t) * Hkv + h.

    Args:
        block_ids: int64 [n] block ids (CPU).
        heads: int64 [n] KV heads, same length.

    Returns:
        int64 [n * 2 * P], fragment-major: fragment i owns rows [i * 2P, (i + 1) * 2P).
    """
    kv_t = torch.arange(2 * block_size, dtype=torch.int64)  # (kv, t) flattened
    return ((block_ids[:, None] * 2 * block_size + kv_t[None, :]) * num_kv_heads + heads[:, None]).reshape(-1)


class RecallIO(ABC):
    """Copies selected host blocks of one layer into device blocks; see the module docstring for the protocol."""

    mode = ""

    def __init__(self, host_pool: KVPool, device_pool: KVPool) -> None:
        if host_pool.block_shape != device_pool.block_shape or host_pool.dtype != device_pool.dtype:
            raise ValueError(
                f"host pool blocks {host_pool.block_shape} {host_pool.dtype} differ from device pool blocks "
                f"{device_pool.block_shape} {device_pool.dtype}"
            )
        self.host = host_pool
        self.device = device_pool
        self.cuda = device_pool.device.type == "cuda"
        self.stream = torch.cuda.Stream(device_pool.device) if self.cuda else None
        self._layer_events = [torch.cuda.Event() for _ in host_pool.layers] if self.cuda else []

    def recall(
        self,
        layer: int,
        src_ids: torch.Tensor,
        dst_block_ids: torch.Tensor,
        heads: torch.Tensor | None = None,
        after: torch.cuda.Event | None = None,
    ) -> int:
        """Copy host blocks into device blocks of one layer.

        Args:
            layer: layer index.
            src_ids: int64 [n] host block ids, CPU.
            dst_block_ids: int64 [n] device block ids, CPU, unique (for head fragments: unique per (block, head)).
            heads: None to move whole blocks; else int64 [n] KV heads, CPU, to move (block, head) fragments.
            after: CUDA only: the event after which the device blocks may be overwritten (e.g. the last attention
                that read them). None waits for all work queued on the current stream, which is safe but
                keeps the copy from overlapping compute queued before this call.

        Returns:
            Bytes moved.

        Raises:
            ValueError: if the index tensors differ in length or are not CPU int64.
        """
        _check_indices(src_ids, dst_block_ids, heads)
        if not self.cuda:
            return self._recall(layer, src_ids, dst_block_ids, heads)
        if after is None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device.device))
        else:
            self.stream.wait_event(after)
        with torch.cuda.stream(self.stream):
            moved = self._recall(layer, src_ids, dst_block_ids, heads)
        self._layer_events[layer].record(self.stream)
        return moved

    def wait(self, layer: int) -> None:
        """Make the current stream wait for `layer`'s last recall (no host sync; no-op on CPU)."""
        if self.cuda:
            torch.cuda.current_stream(self.device.device).wait_event(self._layer_events[layer])

    @abstractmethod
    def _recall(
        self, layer: int, src_ids: torch.Tensor, dst_block_ids: torch.Tensor, heads: torch.Tensor | None
    ) -> int:
        """Issue the copies on the current stream; return bytes moved."""


class PerFragmentIO(RecallIO):
    """One copy per fragment: the baseline."""

    mode = "per_fragment"

    def _recall(
        self, layer: int, src_ids: torch.Tensor, dst_block_ids: torch.Tensor, heads: torch.Tensor | None
    ) -> int:
        src, dst = self.host.layers[layer], self.device.layers[layer]
        pairs = zip(src_ids.tolist(), dst_block_ids.tolist())
        if heads is None:
            for b, s in pairs:
                dst[s].copy_(src[b], non_blocking=True)
            return len(src_ids) * self.host.block_bytes
        for (b, s), h in zip(pairs, heads.tolist()):
            dst[s, :, :, h].copy_(src[b, :, :, h], non_blocking=True)
        return len(src_ids) * self.host.fragment_bytes


class GatherScatterIO(RecallIO):
    """Gather into a staging buffer, one copy to the device, scatter into the device blocks (per chunk)."""

    mode = "gather_scatter"

    def __init__(self, host_pool: KVPool, device_pool: KVPool, staging_bytes: int = 1 << 20) -> None:
        """Preallocate the host staging buffer(s) (two, pinned, on CUDA), and on CUDA a device staging buffer.

        Raises:
            ValueError: if staging_bytes is smaller than one block.
        """
        super().__init__(host_pool, device_pool)
        if staging_bytes < host_pool.block_bytes:
            raise ValueError(f"staging_bytes={staging_bytes} must hold one block ({host_pool.block_bytes} bytes)")
        self.staging_bytes = staging_bytes
        nbytes = -(-staging_bytes // 16) * 16  # room for the widest row element
        # CUDA: two host buffers, so the next chunk's gather overlaps this chunk's copy; CPU: one (it stays in cache).
        num_host_buffers = 2 if self.cuda else 1
        self._staging = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.cuda) for _ in range(num_host_buffers)]
        self._turn = 0
        if self.cuda:
            max_rows = staging_bytes // (host_pool.fragment_bytes // (2 * host_pool.block_size))  # head_dim rows
            self._dev_staging = torch.empty(nbytes, dtype=torch.uint8, device=device_pool.device)
            self._dst_index = [torch.empty(max_rows, dtype=torch.int64, pin_memory=True) for _ in range(2)]
            self._dev_index = torch.empty(max_rows, dtype=torch.int64, device=device_pool.device)
            self._staging_free = [torch.cuda.Event() for _ in range(2)]
        # Hot path: views are built once per (layer, row size); creating one costs microseconds on CPU.
        self._pool_rows: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._stage_rows: dict[int, list[torch.Tensor]] = {}  # host staging buffer(s), then device staging on CUDA

    def _recall(
        self, layer: int, src_ids: torch.Tensor, dst_block_ids: torch.Tensor, heads: torch.Tensor | None
    ) -> int:
        # Hot path: gather host memory in address order (DRAM pages and prefetchers like it); the scatter
        # destinations are unique, so the order does not change the result.
        order = torch.argsort(src_ids)
        src_ids, dst_block_ids = src_ids[order], dst_block_ids[order]
        if heads is None:
            row_bytes, src_rows, dst_rows = self.host.block_bytes, src_ids, dst_block_ids
        else:
            p, hkv, heads = self.host.block_size, self.host.num_kv_heads, heads[order]
            row_bytes = self.host.fragment_bytes // (2 * p)
            src_rows, dst_rows = fragment_rows(src_ids, heads, p, hkv), fragment_rows(dst_block_ids, heads, p, hkv)
        host_rows, dev_rows = self._rows(layer, row_bytes)
        chunk = self.staging_bytes // row_bytes
        if src_rows.shape[0] <= chunk:
            self._chunk(host_rows, dev_rows, src_rows, dst_rows)
        else:
            for start in range(0, src_rows.shape[0], chunk):
                self._chunk(host_rows, dev_rows, src_rows[start : start + chunk], dst_rows[start : start + chunk])
        return src_rows.shape[0] * row_bytes

    def _rows(self, layer: int, row_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(host rows, device rows) of one layer, as `row_view`s, cached."""
        key = (layer, row_bytes)
        if key not in self._pool_rows:
            self._pool_rows[key] = (
                row_view(self.host.layers[layer], row_bytes),
                row_view(self.device.layers[layer], row_bytes),
            )
        return self._pool_rows[key]

    def _chunk(self, host_rows: torch.Tensor, dev_rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Gather rows `src` into staging, copy it to the device, scatter it to rows `dst`."""
        n, row_bytes = src.shape[0], host_rows.shape[1] * host_rows.itemsize
        if row_bytes not in self._stage_rows:
            usable = self.staging_bytes // row_bytes * row_bytes
            buffers = self._staging + ([self._dev_staging] if self.cuda else [])
            self._stage_rows[row_bytes] = [row_view(buf[:usable], row_bytes) for buf in buffers]
        stages = self._stage_rows[row_bytes]
        if not self.cuda:
            # CPU: there is no device memory; the "device" pool is a CPU tensor, so the one copy to the
            # device is the scatter from staging into it (two passes over the bytes: gather, scatter).
            torch.index_select(host_rows, 0, src, out=stages[0][:n])
            dev_rows.index_copy_(0, dst, stages[0][:n])
            return
        turn, self._turn = self._turn, 1 - self._turn
        self._staging_free[turn].synchronize()  # the copy that last read this buffer (two chunks ago)
        stage, dev_stage = stages[turn][:n], stages[2][:n]
        torch.index_select(host_rows, 0, src, out=stage)  # Hot path: one gather for the whole chunk
        dst_pinned, dev_index = self._dst_index[turn][:n], self._dev_index[:n]
        dst_pinned.copy_(dst)
        dev_index.copy_(dst_pinned, non_blocking=True)
        dev_stage.copy_(stage, non_blocking=True)  # the one host-to-device copy of this chunk
        self._staging_free[turn].record()
        dev_rows.index_copy_(0, dev_index, dev_stage)  # scatter on the device


_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8)  # Triton has no complex element type


class GpuGatherIO(RecallIO):
    """A GPU kernel reads the rows from the pinned host pool (CUDA, engine/triton_gather.py); one index-copy on CPU.

    If Triton is missing or refuses the host pointer, calls fall back to ``gather_scatter`` (the CPU gathers
    into a pinned buffer): the same bytes, but not a GPU gather, and ``path`` says so.

    Attributes:
        path: ``"triton_uva"`` (the kernel), ``"gather_scatter_fallback"`` or ``"cpu"``.
    """

    mode = "gpu_gather"

    def __init__(self, host_pool: KVPool, device_pool: KVPool) -> None:
        """Raises ValueError if the pools differ (RecallIO) or, on CUDA, the host pool is not pinned."""
        super().__init__(host_pool, device_pool)
        if self.cuda and not host_pool.layers[0].is_pinned():
            raise ValueError("gpu_gather needs a pinned host pool (KVPool(..., pin_memory=True))")
        self.path = "cpu"
        self._fallback = GatherScatterIO(host_pool, device_pool) if self.cuda else None
        if self.cuda:
            self.path = "triton_uva" if triton_gather.available() else "gather_scatter_fallback"

    def _recall(self, layer: int, src_ids: torch.Tensor, dst_slots: torch.Tensor, heads: torch.Tensor | None) -> int:
        if self.path == "gather_scatter_fallback":
            return self._fallback._recall(layer, src_ids, dst_slots, heads)
        if heads is None:
            row_bytes, src_rows, dst_rows = self.host.block_bytes, src_ids, dst_slots
        else:
            p, hkv = self.host.block_size, self.host.num_kv_heads
            row_bytes = self.host.fragment_bytes // (2 * p)
            src_rows, dst_rows = fragment_rows(src_ids, heads, p, hkv), fragment_rows(dst_slots, heads, p, hkv)
        dtype = next(d for d in _INT_DTYPES if row_bytes % d.itemsize == 0)
        host_rows, dev_rows = (
            pool.layers[layer].view(-1).view(torch.uint8).view(dtype).view(-1, row_bytes // dtype.itemsize)
            for pool in (self.host, self.device)
        )
        if not self.cuda:  # the "device" pool is a CPU tensor: one pass, host rows straight into device rows
            dev_rows.index_copy_(0, dst_rows, host_rows.index_select(0, src_rows))
        elif not triton_gather.gather_rows(host_rows, dev_rows, src_rows, dst_rows):
            self.path = "gather_scatter_fallback"
            return self._fallback._recall(layer, src_ids, dst_slots, heads)
        return src_rows.shape[0] * row_bytes


def make_io(mode: str, host_pool: KVPool, device_pool: KVPool, **kwargs: int) -> RecallIO:
    """Build the I/O engine for `mode` (one of ``IO_MODES``). Raises ValueError otherwise."""
    if mode == "per_fragment":
        return PerFragmentIO(host_pool, device_pool)
    if mode == "gather_scatter":
        return GatherScatterIO(host_pool, device_pool, **kwargs)
    if mode == "gpu_gather":
        return GpuGatherIO(host_pool, device_pool)
    raise ValueError(f"mode={mode!r} must be one of {IO_MODES}")


def offload_blocks(device_pool: KVPool, host_pool: KVPool, device_block_ids: list[int], host_ids: list[int]) -> None:
    """Copy device blocks to host blocks in every layer (device -> host), synchronously.

    Not on the per-layer path: a request offloads one block every block_size steps.

    Raises:
        ValueError: if device_block_ids and host_ids differ in length.
    """
    if len(device_block_ids) != len(host_ids):
        raise ValueError(f"device_block_ids has {len(device_block_ids)} ids but host_ids has {len(host_ids)}")
    if not device_block_ids:
        return
    src = torch.tensor(device_block_ids, dtype=torch.int64, device=device_pool.device)
    dst = torch.tensor(host_ids, dtype=torch.int64)
    for dev_layer, host_layer in zip(device_pool.layers, host_pool.layers):
        host_layer.index_copy_(0, dst, dev_layer.index_select(0, src).cpu())


def _check_indices(src_ids: torch.Tensor, dst_block_ids: torch.Tensor, heads: torch.Tensor | None) -> None:
    for name, t in (("src_ids", src_ids), ("dst_block_ids", dst_block_ids), ("heads", heads)):
        if t is None:
            continue
        if t.dtype != torch.int64 or t.device.type != "cpu" or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D CPU int64 tensor, got {t.dtype} {tuple(t.shape)} on {t.device}")
        if t.shape != src_ids.shape:
            raise ValueError(f"{name} has {t.shape[0]} entries but src_ids has {src_ids.shape[0]}")

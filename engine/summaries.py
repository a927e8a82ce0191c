"""Block summaries: per block, per KV head, per channel minimum and maximum of the (post-RoPE) keys.

Quest scores a block by an upper bound of q . k over its keys, which needs only these two vectors per
head, so summaries stay on the device while the blocks themselves sit in the host pool. They are
indexed by host block id and written once, when a full block is offloaded.

Dimension names: N blocks, P block_size, Hkv KV heads, D head_dim, B requests, C candidate blocks.
"""

from __future__ import annotations

import torch


def summarize_keys(keys: torch.Tensor) -> torch.Tensor:
    """Channel-wise key min and max of whole blocks.

    Args:
        keys: [N, P, Hkv, D], any float dtype and device.

    Returns:
        [N, 2, Hkv, D], keys.dtype: index 0 of dim 1 is the minimum over the P tokens, 1 the maximum.
    """
    return torch.stack([keys.amin(dim=1), keys.amax(dim=1)], dim=1)


class BlockSummaries:
    """Summaries of every host block, per layer, kept on the device.

    Attributes:
        layers: per layer, [num_host_blocks, 2, Hkv, D] in `dtype` on `device`.
    """

    def __init__(
        self,
        num_layers: int,
        num_host_blocks: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (num_host_blocks, 2, num_kv_heads, head_dim)
        self.layers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def update(self, layer: int, host_ids: torch.Tensor, keys: torch.Tensor) -> None:
        """Summarise full blocks and store them under their host ids.

        Args:
            layer: layer index.
            host_ids: int64 [N], unique host block ids, on the summaries' device.
            keys: [N, P, Hkv, D], the blocks' keys, on the summaries' device.

        Raises:
            ValueError: if host_ids and keys disagree on N.
        """
        if host_ids.shape[0] != keys.shape[0]:
            raise ValueError(f"host_ids has {host_ids.shape[0]} ids but keys has {keys.shape[0]} blocks")
        table = self.layers[layer]
        table.index_copy_(0, host_ids, summarize_keys(keys).to(table.dtype))

    def gather(self, layer: int, host_ids: torch.Tensor) -> torch.Tensor:
        """Summaries of candidate blocks: host_ids int64 [B, C] (device) -> [B, C, 2, Hkv, D]."""
        table = self.layers[layer]
        return table[host_ids.reshape(-1)].view(*host_ids.shape, *table.shape[1:])

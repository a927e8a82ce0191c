"""Radix prefix cache over a trace's ``hash_ids`` (SGLang's ``RadixCache``, docs/sources.md §5.6).

A trace row's ``hash_ids`` name its prompt's blocks of ``block_tokens`` tokens (512 in Mooncake's traces, 64
in kvcache_tester's); two prompts share block i exactly when they share ids 0..i (the ids are prefix hashes).
The cache is a tree keyed by that chain: node = (parent node, hash id), holding ``tokens`` tokens of KV —
``block_tokens``, or the prompt's remainder for its last block. Mapping onto the device pool: a node of t
tokens holds ceil(t / page_tokens) pool blocks (``page_tokens`` = the policy's ``block_size``; 1 for SGLang's
default page size, so a 512-token hash block is 512 pool pages).

Rules (as SGLang's radix cache, ``mem_cache/radix_cache.py``):

* **Match**: the longest cached chain of a prompt's ids is its hit (``match_prefix``); at least one prompt
  token is always recomputed (the last token's logits are needed), so hits are capped at prompt − 1.
* **Insert and reference**: an admitted request locks its whole chain (hit nodes, and new nodes for the rest
  of its prompt's blocks, which now hold its prompt KV once for everyone): ``inc_lock_ref``. Its own pool
  charge is only what the chain does not hold (output tokens, a partial tail when ids run out).
* **Release**: a finished or preempted request unlocks its chain (``dec_lock_ref``); nodes stay cached.
* **Evict**: when the pool is short, unreferenced leaves go in least-recently-used order, a parent becoming
  a leaf joins the candidates (``evict``: a heap of evictable leaves by last access time).

Model assumption: generated tokens are not inserted into the tree (a trace's ids cover prompts only).

HiCache (``host_tier=True``, the ``sglang_hicache`` policy; sglang ``mem_cache/hiradix_cache.py``,
docs/sources.md §5.6, §10.2): an evicted node's KV stays in host DRAM (the node stays in the tree, off device); a
hit on it loads it back over the host link, layer by layer overlapped with the prefill forward
(:func:`reload_forward_s`). Writes follow SGLang's default ``--hicache-write-policy write_through``: a node is
backed up to host when it is inserted (``HiRadixCache._insert_helper`` → ``inc_hit_count`` → ``write_backup``,
threshold 1), so every new node's KV crosses D2H once (``host_write_tokens``) and evicting a backed-up node, or
reloading one (which keeps its host copy), writes nothing. Each node backed up, evicted to host or reloaded is one
host-tier operation (``host_node_ops``), a CPU cost of the scheduler. :func:`host_tier_forward` hands both to the
prefill forward that follows. Model assumptions: the host tier is unbounded (SGLang sizes it at
``--hicache-ratio`` × the device pool); a new node's write is queued when the next prefill forward ends (SGLang
writes each chunk's nodes after that chunk: a chunked prompt's later chunks are written early here);
``write_through_selective`` and ``write_back`` are not modelled.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class Node:
    """One cached hash block: ``tokens`` tokens of KV in ``blocks`` pool blocks."""

    key: tuple[int, int]  # (parent node id, hash id)
    parent: Node | None
    tokens: int
    blocks: int
    refs: int = 0
    last_used_s: float = 0.0
    children: int = 0  # children on device (a node is evictable from device once this is 0)
    on_device: bool = True  # False: evicted to the host tier (HiCache), reloaded on a hit
    node_id: int = field(default=0)


class PrefixCache:
    """A radix (hash-chain) prefix cache whose nodes hold device-pool blocks.

    Args:
        page_tokens: tokens per device-pool block (the policy's ``block_size``).

    Each call names the trace's ``block_tokens`` (tokens per hash block: Mooncake 512, kvcache_tester 64).

    Counters (pool blocks): ``cached_blocks`` (held by nodes), ``evictable_blocks`` (held by unreferenced
    nodes).
    """

    def __init__(self, page_tokens: int, host_tier: bool = False) -> None:
        self.page_tokens = page_tokens
        self.host_tier = host_tier
        self.host_blocks = 0  # blocks of nodes kept in host DRAM (HiCache)
        self.reloaded_tokens = 0  # host-tier tokens the last :meth:`acquire` loaded back to the device
        self.host_write_tokens = 0  # HiCache: tokens of new nodes to write through to host, not yet queued
        self.host_node_ops = 0  # HiCache: host-tier node operations (backup, evict, reload) not yet charged
        self.nodes: dict[tuple[int, int], Node] = {}
        self.cached_blocks = 0
        self.evictable_blocks = 0
        self._next_id = 1
        # Evictable leaves by last use; entries go stale when a node is locked, gains a child or is re-used,
        # and are skipped when popped (a node that becomes evictable again is pushed again).
        self._leaves: list[tuple[float, int, Node]] = []

    @staticmethod
    def chain_tokens(hash_ids: Sequence[int], prompt_tokens: int, block_tokens: int) -> list[int]:
        """Tokens of each of the prompt's hash blocks (the last one may be partial); ids past the prompt dropped."""
        n = min(len(hash_ids), -(-prompt_tokens // block_tokens))
        return [min(block_tokens, prompt_tokens - i * block_tokens) for i in range(n)]

    def match(self, hash_ids: Sequence[int], prompt_tokens: int, block_tokens: int) -> tuple[list[Node], int]:
        """The cached chain of a prompt and its hit tokens (capped at prompt − 1); no side effects."""
        path: list[Node] = []
        parent_id = 0
        nodes = self.nodes
        for hid in hash_ids[: -(-prompt_tokens // block_tokens)]:
            node = nodes.get((parent_id, hid))
            if node is None:
                break
            path.append(node)
            parent_id = node.node_id
        hit = sum(n.tokens for n in path)
        return path, min(hit, max(prompt_tokens - 1, 0))

    def locked_evictable_blocks(self, path: list[Node]) -> int:
        """Evictable blocks a request would lock by taking ``path`` (they stop being evictable)."""
        return sum(n.blocks for n in path if n.refs == 0 and n.on_device)

    def acquire(
        self, hash_ids: Sequence[int], prompt_tokens: int, block_tokens: int, now_s: float
    ) -> tuple[list[Node], int, int]:
        """Lock the prompt's chain, adding nodes past the hit; returns (chain, hit tokens, new node blocks).

        The caller has made room for the new node blocks in the pool (they are counted in ``cached_blocks``).
        """
        path, hit = self.match(hash_ids, prompt_tokens, block_tokens)
        added = self.reloaded_tokens = 0
        for node in path:  # host-tier nodes come back to the device (top-down, so parents are on device)
            if not node.on_device:
                node.on_device = True
                self.host_blocks -= node.blocks
                self.cached_blocks += node.blocks
                self.evictable_blocks += node.blocks  # unreferenced until locked below
                added += node.blocks
                self.reloaded_tokens += node.tokens
                self.host_node_ops += 1
                if node.parent is not None:
                    node.parent.children += 1
        parent = path[-1] if path else None
        chain = list(zip(hash_ids, self.chain_tokens(hash_ids, prompt_tokens, block_tokens)))
        for hid, tokens in chain[len(path) :]:
            key = (parent.node_id if parent else 0, hid)
            node = Node(key, parent, tokens, -(-tokens // self.page_tokens), node_id=self._next_id)
            self._next_id += 1
            self.nodes[key] = node
            if parent is not None:
                parent.children += 1
            self.cached_blocks += node.blocks
            self.evictable_blocks += node.blocks  # unreferenced until locked below
            added += node.blocks
            path.append(node)
            parent = node
            if self.host_tier:  # write_through: backed up to host when inserted
                self.host_write_tokens += tokens
                self.host_node_ops += 1
        self._lock(path, now_s)
        return path, hit, added

    def _lock(self, path: list[Node], now_s: float) -> None:
        for node in path:
            if node.refs == 0:
                self.evictable_blocks -= node.blocks
            node.refs += 1
            node.last_used_s = now_s

    def release(self, path: list[Node], now_s: float) -> None:
        """Unlock a request's chain (finish or preemption); nodes stay cached and become evictable at 0."""
        for node in path:
            node.refs -= 1
            assert node.refs >= 0, "prefix node released more often than locked"
            node.last_used_s = now_s
            if node.refs == 0:
                self.evictable_blocks += node.blocks
                if node.children == 0:
                    heapq.heappush(self._leaves, (now_s, node.node_id, node))

    def evict(self, blocks: int) -> int:
        """Free at least ``blocks`` pool blocks from unreferenced leaves, least recently used first.

        Returns the blocks freed (less than asked when not enough is evictable).
        """
        heap = self._leaves
        freed = 0
        while freed < blocks and heap:
            used_s, _, node = heapq.heappop(heap)
            stale = node.refs or node.children or not node.on_device or used_s != node.last_used_s
            if stale or self.nodes.get(node.key) is not node:
                continue
            if self.host_tier:  # HiCache: the node keeps its host copy (written through), stays matchable
                node.on_device = False
                self.host_blocks += node.blocks
                self.host_node_ops += 1
            else:
                del self.nodes[node.key]
            freed += node.blocks
            self.cached_blocks -= node.blocks
            self.evictable_blocks -= node.blocks
            parent = node.parent
            if parent is not None:
                parent.children -= 1
                if parent.children == 0 and parent.refs == 0:
                    heapq.heappush(heap, (parent.last_used_s, parent.node_id, parent))
        return freed


def host_tier_forward(prefix: PrefixCache | None, forward_s: float, node_op_us: float) -> tuple[float, int]:
    """What HiCache's host tier adds to a prefill forward of ``forward_s`` seconds: (its seconds plus the host-tier
    node operations since the last forward at ``node_op_us`` µs each — the scheduler's CPU, before the forward
    (the policy's ``hicache_node_op_us``) —, tokens of new nodes to write through to host when it ends). Drains
    ``prefix``'s counters; ``(forward_s, 0)`` without a host tier."""
    if prefix is None or not prefix.host_tier:
        return forward_s, 0
    ops, tokens = prefix.host_node_ops, prefix.host_write_tokens
    prefix.host_node_ops = prefix.host_write_tokens = 0
    return (forward_s + ops * node_op_us * 1e-6 if ops and node_op_us else forward_s), tokens


def reload_forward_s(compute_s: float, load_s: float, num_layers: int) -> float:
    """A prefill forward that also loads ``load_s`` seconds of host-tier KV, layer by layer (HiCache's
    layer-wise overlap): layer l's load runs while layer l − 1 computes, so the forward takes
    ``max(compute_s, load_s) + load_s / num_layers`` (the first layer's load is never hidden)."""
    if load_s <= 0:
        return compute_s
    return max(compute_s, load_s) + load_s / num_layers

"""The KV of prompt prefixes shared across calls, computed once (the hf engine's prefix cache).

Every call of a job starts with the same instructions and question; a document's records call
repeats its memory update's prompt up to the chunk. The cache keeps the KV of prompts already
prefilled, in blocks of :data:`BLOCK` tokens along a trie keyed by the blocks' token ids (never
text: a prefix that ends inside a BPE merge is two different token sequences and does not
match). A new prompt reuses the KV of its longest prefix of whole cached blocks and computes
only the rest; this works because a token's keys and values depend only on the tokens before it
and its position (each row's positions start at 0: the engine prefills rows unpadded).

Memory is bounded: blocks are evicted least recently used first, by bytes. A lookup touches the
blocks it walks from the leaf up, so a parent is always more recent than its children and the
oldest block is always a leaf (evicting it never strands a child).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

# Tokens per trie block: a lookup reuses at most the prompt's whole blocks (up to BLOCK - 1
# tokens of a shared prefix are recomputed), and every block is one tensor of all layers' KV.
BLOCK = 32


@dataclass(eq=False)
class _Node:
    tokens: tuple[int, ...]
    kv: torch.Tensor | None  # [layers, 2, H_kv, BLOCK, D]: keys and values of this block (None: the root)
    parent: _Node | None
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size() if self.kv is not None else 0


class PrefixCache:
    """KV of prompt prefixes by token ids, at most ``max_bytes`` of it (LRU by bytes).

    Args:
        max_bytes: the bound on the KV held (blocks are evicted least recently used first).
    """

    def __init__(self, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evicted_blocks = 0
        self._root = _Node((), None, None)
        self._lru: OrderedDict[int, _Node] = OrderedDict()  # id(node) -> node, least recent first

    def __len__(self) -> int:
        """Blocks held."""
        return len(self._lru)

    def lookup(self, ids: Sequence[int]) -> tuple[int, torch.Tensor | None]:
        """The cached length ``m`` of ``ids``' longest prefix of whole blocks, and its KV
        ``[layers, 2, H_kv, m, D]`` (None when ``m`` is 0); the blocks become the most recent."""
        path = self._walk(ids)
        if not path:
            return 0, None
        for node in reversed(path):  # leaf first: parents end up more recent than children
            self._lru.move_to_end(id(node))
        return len(path) * BLOCK, torch.cat([node.kv for node in path], dim=3)  # type: ignore[misc]

    def insert(self, ids: Sequence[int], kv: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep the KV of ``ids``' whole blocks; ``kv``: per layer ``(keys, values)`` ``[H_kv, n, D]``
        with ``n >= len(ids)`` rounded down to a block (positions from 0). Blocks already held are kept
        as they are; new ones are copied out of ``kv`` (the caller's tensors are not retained)."""
        node, path = self._root, []
        for start in range(0, len(ids) - BLOCK + 1, BLOCK):
            key = tuple(ids[start : start + BLOCK])
            child = node.children.get(key)
            if child is None:
                block = torch.stack([torch.stack((k[:, start : start + BLOCK], v[:, start : start + BLOCK]))
                                     for k, v in kv])
                child = _Node(key, block, node)
                node.children[key] = child
                self._lru[id(child)] = child
                self.bytes += child.nbytes
            node = child
            path.append(node)
        for n in reversed(path):
            self._lru.move_to_end(id(n))
        self._evict()

    def clear(self) -> None:
        """Drop every block (the weights changed: the KV no longer matches the model)."""
        self._root.children.clear()
        self._lru.clear()
        self.bytes = 0

    def _walk(self, ids: Sequence[int]) -> list[_Node]:
        path, node = [], self._root
        for start in range(0, len(ids) - BLOCK + 1, BLOCK):
            node = node.children.get(tuple(ids[start : start + BLOCK]))  # type: ignore[assignment]
            if node is None:
                break
            path.append(node)
        return path

    def _evict(self) -> None:
        while self.bytes > self.max_bytes and self._lru:
            _, node = self._lru.popitem(last=False)
            assert not node.children, "the least recent block has no children (parents are touched after them)"
            assert node.parent is not None
            del node.parent.children[node.tokens]
            self.bytes -= node.nbytes
            self.evicted_blocks += 1

"""A KV cache that reserves its final length up front, so decode steps write in place.

transformers' ``DynamicCache`` concatenates at every step (``[B, H, n, D]`` → ``[B, H, n + 1, D]``),
copying each layer's whole cache per generated token. With 4 rows × 4K tokens of a small model
that is ~1.5 GB of copies per token, more memory traffic than reading the weights. Reserving
``prompt + max_new_tokens`` slots once makes a step write one slot and hand attention a view of
the filled part; the arithmetic is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer


class ReservedLayer(DynamicLayer):
    """One layer's keys/values in a buffer of ``capacity`` positions; grows ×1.5 if outrun."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``[B, H, t, D]`` new states after the ``n`` cached ones; return views ``[B, H, n + t, D]``."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, t = self.get_seq_length(), key_states.shape[-2]
        if not self._holds_cache(key_states, n + t):
            self._reserve(n, key_states, value_states, max(self.capacity, n + t, int(1.5 * n)))
        assert self._k is not None and self._v is not None
        self._k[:, :, n : n + t] = key_states
        self._v[:, :, n : n + t] = value_states
        self.keys, self.values = self._k[:, :, : n + t], self._v[:, :, : n + t]
        return self.keys, self.values

    def _holds_cache(self, key_states: torch.Tensor, needed: int) -> bool:
        """The buffer exists, fits ``needed`` positions and still backs ``self.keys``.

        ``batch_select_indices``/``reset`` replace ``self.keys`` with a new tensor; then the
        buffer is stale and is rebuilt from ``self.keys``.
        """
        return (self._k is not None and self._k.shape[0] == key_states.shape[0] and needed <= self._k.shape[-2]
                and self.keys is not None and self.keys.data_ptr() == self._k.data_ptr())

    def _reserve(self, n: int, key_states: torch.Tensor, value_states: torch.Tensor, capacity: int) -> None:
        b, h, _, d = key_states.shape
        k = key_states.new_empty((b, h, capacity, d))
        v = value_states.new_empty((b, h, capacity, value_states.shape[-1]))
        if n:
            k[:, :, :n] = self.keys
            v[:, :, :n] = self.values
        self._k, self._v, self.capacity = k, v, capacity


class ReservedCache(DynamicCache):
    """A ``DynamicCache`` of :class:`ReservedLayer`; optionally filled with per-layer ``(K, V)``.

    Args:
        num_layers: decoder layers of the model.
        capacity: positions to reserve per layer (prompt + max new tokens).
        kv: per-layer ``(keys, values)`` ``[B, H_kv, n, D]`` already computed (a prefill).
    """

    def __init__(self, num_layers: int, capacity: int,
                 kv: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None):
        Cache.__init__(self, layers=[ReservedLayer(capacity) for _ in range(num_layers)])
        for layer, (k, v) in zip(self.layers, kv or []):
            layer.update(k, v)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions of every layer (views: the reservation stays).

        The speculative decode loop's rollback: drafted positions past ``length`` are dropped and
        the next update writes over them in place.
        """
        for layer in self.layers:
            if layer.is_initialized and layer.keys is not None and layer.keys.shape[-2] > length:
                layer.keys, layer.values = layer.keys[:, :, :length], layer.values[:, :, :length]

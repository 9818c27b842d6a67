"""Per-session KV caches that grow in place (no gRPC here).

Hugging Face's `DynamicLayer` appends with `torch.cat`, so every forward copies the session's whole
KV: each draft step and each verify round moved O(context) bytes per layer before computing
anything (and the old batched pass concatenated every row's cache once more). A `SessionLayer`
keeps keys and values in a buffer with room to spare ([B, H, capacity, D]) and writes only the new
tokens into it; `keys` / `values` are views of the used part. When the room runs out the capacity
doubles (a session of L tokens is copied O(log L) times over its life, not once per forward).
Cropping (rejected drafts, a rollback) only shortens the views; later tokens overwrite the dead
entries.

A buffer belongs to one session. Nothing else may hold a view of it past that session's next write:
the prefix cache stores and hands out copies (calispec_core/prefix_cache.py).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from calispec_core.errors import InvalidArgument

GROWTH_BLOCK = 256  # capacities are multiples of this many tokens


class SessionLayer(DynamicLayer):
    """One layer's keys and values for one session, in a preallocated buffer."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer: torch.Tensor | None = None  # [B, H, capacity, D]
        self._value_buffer: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """HF's per-layer hook: append [B, H, n, D] new entries; returns every entry ([B, H, L + n, D] views)."""
        self.append(key_states, value_states)
        return self.keys, self.values

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Write [B, H, n, D] new keys and values after the cached ones (a copy of the n entries only)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        self._reserve(key_states, value_states, end)
        assert self._key_buffer is not None and self._value_buffer is not None
        self._key_buffer[:, :, length:end] = key_states
        self._value_buffer[:, :, length:end] = value_states
        self.keys, self.values = self._key_buffer[:, :, :end], self._value_buffer[:, :, :end]

    @property
    def capacity(self) -> int:
        """Entries the buffer holds before it has to grow."""
        return 0 if not self.is_initialized or self._key_buffer is None else self._key_buffer.shape[-2]

    def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        """Make room for `needed` entries: a new buffer of at least twice the capacity, the cached part copied."""
        if needed <= self.capacity:
            return
        capacity = -(-max(needed, 2 * self.capacity) // GROWTH_BLOCK) * GROWTH_BLOCK
        length = self.get_seq_length()
        keys = key_states.new_empty((*key_states.shape[:2], capacity, key_states.shape[-1]))
        values = value_states.new_empty((*value_states.shape[:2], capacity, value_states.shape[-1]))
        if length:
            keys[:, :, :length] = self.keys
            values[:, :, :length] = self.values
        self._key_buffer, self._value_buffer = keys, values

    def _unsupported(self, *args: object, **kwargs: object) -> None:
        """HF's versions replace `keys` with a new tensor that the next `append` would silently drop."""
        raise NotImplementedError("session KV caches support neither beam search nor offloading")

    reorder_cache = batch_select_indices = batch_repeat_interleave = offload = prefetch = _unsupported


def new_session_cache(config: object) -> DynamicCache:
    """A `DynamicCache` for `config`'s model whose layers grow in place."""
    cache = DynamicCache(config=config)
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        kinds = sorted({type(layer).__name__ for layer in cache.layers})
        raise InvalidArgument(f"only full-attention models are served; this model's cache layers are {kinds}")
    cache.layers = [SessionLayer() for _ in cache.layers]
    return cache


def crop_to(cache: DynamicCache, length: int) -> None:
    """Every layer back to at most `length` entries. Layer by layer, because a forward that raised part
    of the way through has extended only the layers before the failure (a crop only shortens a
    `SessionLayer`'s views)."""
    for layer in cache.layers:
        if (excess := layer.get_seq_length() - length) > 0:
            layer.crop(-excess)

"""Recently prefilled prompts' KV, reused by prompts that start the same way (no gRPC here).

Chat requests share a system prompt and a template; benchmarks, retries and load tests repeat whole
prompts. A new prompt whose first L tokens equal an entry's first L tokens starts its session with
those L entries and prefills only the rest (vLLM's automatic prefix caching and SGLang's radix
cache do this at block granularity; here a prompt is one entry). Under lockstep the requests of a
group end together, so their successors' prefills used to run back to back while every other
session waited ("prefill storms", docs/performance.md).

Entries are copies, and a hit copies its prefix into the new session's cache: sessions write their
caches in place (calispec_core/kv_cache.py), so a shared view would let one session's later tokens
(or a rollback into its prompt) overwrite another's. One copy of a prompt's KV per prefill, far
cheaper than the forward it replaces. Bounded by cached tokens, least recently used out.

Exactness: a prompt that matches an entry up to its last cached token reuses bit-identical KV
(the same prompt twice computes the same thing; a prompt that rode in a batched forward,
`modeling.prefill_session`, stored the KV of that forward, which may differ in rounding from a
forward of the prompt alone). A partial match computes the rest on top of the
stored prefix, as the chunked prefill already does between chunks; its rounding may differ from
one uninterrupted prefill, as any change of chunk boundaries may.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from calispec_core.limits import DEFAULT_PREFIX_CACHE_TOKENS

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, H, L, D]

MIN_REUSED_TOKENS = 16  # a shorter common prefix is not worth an entry's lookup and bookkeeping


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share (at most the cache's size in steps per lookup)."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@dataclass
class PrefixCacheStats:
    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0  # prompt tokens whose prefill a hit saved


class PrefixCache:
    """Up to `max_tokens` cached prompt tokens over all entries (0 disables the cache)."""

    def __init__(self, max_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS, min_reused: int = MIN_REUSED_TOKENS) -> None:
        if max_tokens < 0:
            raise ValueError(f"prefix cache size must be >= 0 tokens, got {max_tokens}")
        self.max_tokens = max_tokens
        self.min_reused = min_reused
        self.stats = PrefixCacheStats()
        self._entries: OrderedDict[tuple[int, ...], Layers] = OrderedDict()  # least recently used first
        self._tokens = 0
        self._lock = threading.Lock()

    @property
    def cached_tokens(self) -> int:
        return self._tokens

    def attach(self, prompt: Sequence[int], cache: DynamicCache) -> int:
        """Fill an empty `cache` with the longest stored prefix of `prompt`; returns its length (0: none)."""
        if not self.max_tokens:
            return 0
        wanted = tuple(prompt)
        with self._lock:
            self.stats.lookups += 1
            best, length = None, 0
            for tokens in self._entries:
                common = common_prefix_length(tokens, wanted)
                if common > length:
                    best, length = tokens, common
            if best is None or length < self.min_reused:
                return 0
            self._entries.move_to_end(best)
            layers = self._entries[best]
            self.stats.hits += 1
            self.stats.reused_tokens += length
        for layer, (keys, values) in zip(cache.layers, layers, strict=True):
            layer.update(keys[:, :, :length], values[:, :, :length])  # copied into the session's own buffer
        return length

    def store(self, prompt: Sequence[int], cache: DynamicCache) -> None:
        """Keep the KV of `prompt` (the first len(prompt) entries of `cache`: a riding prefill's session holds more
        by then) for later prompts; the oldest entries make room."""
        if not self.max_tokens or len(prompt) < self.min_reused or len(prompt) > self.max_tokens:
            return
        key = tuple(prompt)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return
            n = len(key)
            layers = [(layer.keys[:, :, :n].clone(), layer.values[:, :, :n].clone()) for layer in cache.layers]
            self._entries[key] = layers
            self._tokens += len(key)
            while self._tokens > self.max_tokens:
                old, _ = self._entries.popitem(last=False)
                self._tokens -= len(old)

"""The coordinator's tokenizer keeps no word cache per thread (coordinator.server.without_word_cache).

tokenizers 0.23 gave each thread that encodes a BPE word cache of its own (up to 10,000 words); the coordinator
encodes on many worker threads, so varied prompts could grow its memory by a cache per thread (found by a heaptrack
while looking for wave 56's growth, which it does not explain: docs/robustness.md)."""

from __future__ import annotations

import random
import string
import threading

from coordinator.server import _tokenizer
from tests.conftest import TinyPair

THREADS = 8
WORDS = 12_000  # distinct words each thread encodes: past the cache's 10,000


def rss_anon_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon")) / 1024


def growth_with_threads_alive(encode) -> float:
    """RssAnon growth (MB) once THREADS live threads have each encoded WORDS distinct random words."""
    encoded = threading.Barrier(THREADS + 1)
    leave = threading.Event()

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(WORDS // 20):
                words = ("".join(rng.choices(string.ascii_lowercase, k=rng.randint(4, 9))) for _ in range(20))
                encode(" ".join(words))
        finally:
            encoded.wait()
            leave.wait()

    before = rss_anon_mb()
    threads = [threading.Thread(target=work, args=(seed,), daemon=True) for seed in range(THREADS)]
    for thread in threads:
        thread.start()
    encoded.wait()
    grown = rss_anon_mb() - before
    leave.set()
    for thread in threads:
        thread.join()
    return grown


def test_coordinator_tokenizer_keeps_no_word_cache_per_thread(tiny_pair: TinyPair) -> None:
    """With tokenizers' per-thread caches, 8 threads that encoded 12,000 distinct words each held ~30 MB more (the
    tiny pair's tokenizer); uncached, ~2-3 MB (their stacks, the merges in flight)."""
    tokenizer = _tokenizer(tiny_pair.target)
    assert growth_with_threads_alive(tokenizer.encode) < 12


def test_encoding_is_unchanged_without_the_word_cache(tiny_pair: TinyPair) -> None:
    from transformers import AutoTokenizer

    cached = AutoTokenizer.from_pretrained(str(tiny_pair.target), local_files_only=True)
    uncached = _tokenizer(tiny_pair.target)
    for text in ("def add(a, b):\n    return a + b\n", "Once upon a time", "zqxj wvvk the the the", ""):
        assert uncached.encode(text) == cached.encode(text) == cached.encode(text)

"""`python -m calispec_tools.bench.memory [--seconds S] [--writers N]`: what the correction memory costs.

Prints (nothing about time is asserted):
1. events/s the memory service absorbs over gRPC on this machine: N verifier-like writer
   processes (writer token, 256 aggregated pairs per RecordEvents, counts 1-3) for S seconds against an
   in-process server with group commit (flush interval 0.5 s, synchronous=FULL), rate limit off;
   events counted only once committed (checked in SQLite at the end);
2. the verifier-side lookup of one round: `PairTable.counts` for B x γ pairs on a table of
   65,536 pairs (the default cap), as a share of one target forward pass of the random
   Llama-style model of `calispec_tools.bench.verifier` (V = 151,936) over [B, γ+1] tokens.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from calispec.v1 import memory_pb2, memory_pb2_grpc
from calispec_core.credentials import writer_metadata
from calispec_core.grpc_server import make_channel
from calispec_tools.bench.verifier import VOCAB, forward_fn, median_ms, synthetic_llama
from memory_service.config import MemoryConfig
from memory_service.server import create_server
from memory_service.store import CorrectionStore
from target_service.pair_table import PairTable

TOKEN = "bench-writer-token-0123456789abcdef"
TABLE_PAIRS = 65_536


def _write_until(port: int, seed: int, deadline: float) -> int:
    """One verifier-like writer (its own process): RecordEvents until the wall-clock deadline."""
    rng = random.Random(seed)
    sent = 0
    with make_channel(f"127.0.0.1:{port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        metadata = writer_metadata(TOKEN, f"bench-{seed}")
        while time.time() < deadline:
            pairs = {(rng.randrange(2000), rng.randrange(2000)) for _ in range(256)}
            events = [
                memory_pb2.PairCount(draft_token_id=d, target_token_id=t, count=rng.randint(1, 3)) for d, t in pairs
            ]
            stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="bench", events=events), metadata=metadata)
            sent += 1
    return sent


def absorb(seconds: float, writers: int, db: Path) -> tuple[float, float]:
    """(committed events/s, RecordEvents/s); writers are separate processes, as verifiers are."""
    config = MemoryConfig(port=0, db_path=db, writer_token=TOKEN, writer_events_per_s=0, flush_interval_s=0.5)
    server, port, store = create_server(config)
    server.start()
    start = time.monotonic()
    deadline = time.time() + seconds
    # spawn, not fork: a forked child would inherit this process's gRPC state
    with ProcessPoolExecutor(writers, mp_context=multiprocessing.get_context("spawn")) as pool:
        requests = sum(pool.map(_write_until, [port] * writers, range(writers), [deadline] * writers))
    store.hub.close()
    server.stop(None).wait()
    store.close()  # commits the tail, so every acknowledged event is counted
    elapsed = time.monotonic() - start
    with CorrectionStore(db, flush_interval_s=0) as reopened:
        total = reopened.stats("bench")[0]
    return total / elapsed, requests / elapsed


def lookup_share(batch: int, gamma: int, reps: int) -> tuple[float, float]:
    """(lookup ms per round, forward ms) on CPU."""
    device = torch.device("cpu")
    rng = torch.Generator().manual_seed(0)
    table = PairTable(VOCAB, device)
    pairs = torch.randint(VOCAB, (3, TABLE_PAIRS), generator=rng)
    pairs[2] = torch.randint(1, 50, (TABLE_PAIRS,), generator=rng)
    table.replace_snapshot((pairs[0], pairs[1], pairs[2]), version=1)
    draft = torch.randint(VOCAB, (batch, gamma), generator=rng)
    target = torch.randint(VOCAB, (batch, gamma), generator=rng)
    lookup_ms = median_ms(lambda: table.counts(draft, target), reps, device)
    forward_ms = median_ms(forward_fn(synthetic_llama(device), batch, gamma, device), max(reps // 10, 3), device)
    return lookup_ms, forward_ms


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m calispec_tools.bench.memory", description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--writers", type=int, default=4)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        events_s, requests_s = absorb(args.seconds, args.writers, Path(tmp) / "bench.db")
    print(
        f"absorb: {events_s:,.0f} events/s committed "
        f"({requests_s:,.0f} RecordEvents/s of 256 pairs, {args.writers} writers)"
    )
    for batch, gamma in [(1, 6), (8, 6)]:
        lookup_ms, forward_ms = lookup_share(batch, gamma, reps=200)
        print(
            f"lookup B={batch} γ={gamma}: {lookup_ms * 1000:.0f} µs per round vs forward {forward_ms:.1f} ms "
            f"= {lookup_ms / forward_ms:.3%} of a target forward (paper: 0.01-0.02% of latency)"
        )


if __name__ == "__main__":
    main()

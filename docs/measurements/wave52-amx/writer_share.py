"""One bulk writer beside another writer's durable write, on a memory service in process (wave 52).

The bulk writer sends eight writes of 100,000 new pairs back to back (within its default burst of 1,000,000 events;
wave 51's probe: five in 10 s, half its rate, under load), each sent again
after a RESOURCE_EXHAUSTED (as `calispec calibrate` does); once its second write is accepted, the other writer sends
one durable 1-event write. Prints how long that write took (the store gives up after 30 s) and when the bulk writes
were committed.
Run from the repository root: .venv/bin/python docs/measurements/wave52-amx/writer_share.py
"""

from __future__ import annotations

import platform
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path.cwd()))
from calispec.v1 import memory_pb2, memory_pb2_grpc
from calispec_core.credentials import writer_metadata
from calispec_core.grpc_server import make_channel
from memory_service.config import MemoryConfig
from memory_service.server import create_server

BULK, OTHER = "token-of-the-bulk-writer-0123", "token-of-the-other-writer-012"
VOCAB = 151_936


def bulk_writes(
    stub: memory_pb2_grpc.MemoryServiceStub, start: float, log: list[str], second_accepted: threading.Event
) -> None:
    rng = random.Random(0)
    for i in range(8):
        pairs = {(rng.randrange(VOCAB), rng.randrange(VOCAB)) for _ in range(100_000)}
        events = [memory_pb2.PairCount(draft_token_id=d, target_token_id=t, count=1) for d, t in pairs]
        request = memory_pb2.RecordEventsRequest(namespace="ns", events=events, vocab_size=VOCAB)
        refusals = 0
        while True:
            try:
                stub.RecordEvents(request, timeout=120, metadata=writer_metadata(BULK))
                break
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                refusals += 1
                pushback = dict(exc.trailing_metadata() or ()).get("grpc-retry-pushback-ms")  # wave 52's servers
                time.sleep(int(pushback) / 1000 if pushback else 0.5)
        log.append(f"bulk write {i}: accepted at {time.monotonic() - start:5.1f} s after {refusals} refusals")
        if i == 1:
            second_accepted.set()


def main() -> None:
    print(f"python {platform.python_version()} on {platform.processor() or platform.machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        config = MemoryConfig(port=0, db_path=Path(tmp) / "m.db", writer_tokens=(("bulk", BULK), ("other", OTHER)))
        server, port, store = create_server(config)
        server.start()
        try:
            with make_channel(f"127.0.0.1:{port}") as channel:
                stub = memory_pb2_grpc.MemoryServiceStub(channel)
                log: list[str] = []
                start = time.monotonic()
                second_accepted = threading.Event()
                bulk = threading.Thread(target=bulk_writes, args=(stub, start, log, second_accepted))
                bulk.start()
                second_accepted.wait()
                request = memory_pb2.RecordEventsRequest(
                    namespace="ns",
                    events=[memory_pb2.PairCount(draft_token_id=1, target_token_id=2, count=1)],
                    vocab_size=VOCAB,
                    wait_durable=True,
                )
                sent = time.monotonic()
                try:
                    stub.RecordEvents(request, timeout=60, metadata=writer_metadata(OTHER))
                    outcome = "committed"
                except grpc.RpcError as exc:
                    outcome = f"{exc.code().name}: {exc.details()}"
                took = time.monotonic() - sent
                print(
                    f"other writer's durable 1-event write: sent at {sent - start:.1f} s, took {took:.1f} s ({outcome})"
                )
                bulk.join()
                flush = memory_pb2.RecordEventsRequest(namespace="ns", wait_durable=True, vocab_size=VOCAB)
                stub.RecordEvents(flush, timeout=120, metadata=writer_metadata(OTHER))
                print("\n".join(log))
                print(f"all bulk writes committed by {time.monotonic() - start:.1f} s")
        finally:
            server.stop(None).wait()
            store.close()


if __name__ == "__main__":
    main()

"""kill -9 of the memory service during a write storm: bounded loss, intact database, full restore."""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import grpc

from calispec.v1 import memory_pb2, memory_pb2_grpc
from calispec_core.credentials import writer_metadata
from calispec_core.grpc_server import make_channel
from tests.helpers import spawn_memory_service

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKEN = "crash-test-writer-token-0123456789"
FLUSH_INTERVAL_S = 0.2
# Loss bound checked: events acknowledged in the last flush interval plus this much slack for
# the flush in progress and a loaded 2-core CI machine (the README states interval + one flush).
SLACK_S = 0.5
WRITERS = 4


def service_log(db: Path) -> Path:
    """Where the services started on `db` write their stderr (both runs append to it)."""
    return db.parent / "service.log"


def start_service(db: Path, token_file: Path) -> tuple[subprocess.Popen[str], str]:
    extra = ["--flush-interval", str(FLUSH_INTERVAL_S), "--writer-rate-limit", "0", "--log-level", "INFO"]
    with service_log(db).open("a") as log:  # kept in the test's tmp dir, for a failure's story
        proc, line = spawn_memory_service(db, token_file, *extra, stderr=log.fileno())
    assert line.startswith("memory_service listening on"), line
    return proc, line.split()[3]


def test_kill_9_during_write_storm_loses_at_most_the_last_flush_interval(tmp_path: Path) -> None:
    db, token_file = tmp_path / "memory.db", tmp_path / "token"
    token_file.write_text(TOKEN)
    proc, address = start_service(db, token_file)
    acked: list[tuple[float, Counter[tuple[int, int]]]] = []  # (ack time, events) per acknowledged write
    lock = threading.Lock()
    stop = threading.Event()

    def storm(seed: int) -> None:
        rng = random.Random(seed)
        with make_channel(address) as channel:
            stub = memory_pb2_grpc.MemoryServiceStub(channel)
            while not stop.is_set():
                batch = Counter({(rng.randrange(50), rng.randrange(50)): rng.randint(1, 5) for _ in range(20)})
                events = [
                    memory_pb2.PairCount(draft_token_id=d, target_token_id=t, count=c) for (d, t), c in batch.items()
                ]
                try:
                    stub.RecordEvents(
                        memory_pb2.RecordEventsRequest(namespace="ns", events=events),
                        timeout=5,
                        metadata=writer_metadata(TOKEN, f"w{seed}"),
                    )
                except grpc.RpcError:
                    return  # the service is gone
                with lock:
                    acked.append((time.monotonic(), batch))

    threads = [threading.Thread(target=storm, args=(i,)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    time.sleep(1.5)  # several flushes commit during the storm
    killed_at = time.monotonic()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stop.set()
    for t in threads:
        t.join()
    assert proc.stdout is not None
    proc.stdout.close()

    with sqlite3.connect(db) as conn:  # opening replays the WAL, as a restarted service would
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        stored = {
            (d, t): c for d, t, c in conn.execute("SELECT draft_token_id, target_token_id, count FROM pair_counts")
        }
    sent: Counter[tuple[int, int]] = Counter()
    for _, batch in acked:
        sent.update(batch)
    assert all(stored.get(k, 0) <= c for k, c in sent.items()) and set(stored) <= set(sent)  # nothing invented
    lost = sum(sent.values()) - sum(stored.values())
    recent = sum(sum(b.values()) for at, b in acked if at >= killed_at - FLUSH_INTERVAL_S - SLACK_S)
    print(f"acked {sum(sent.values())} events in {len(acked)} writes; lost {lost}; bound {recent}")
    assert sum(stored.values()) > 0
    assert 0 <= lost <= recent

    restarted, address = start_service(db, token_file)  # restart restores everything that was committed
    try:
        with make_channel(address) as channel:
            stats = memory_pb2_grpc.MemoryServiceStub(channel).GetStats(memory_pb2.GetStatsRequest(namespace="ns"))
        assert (stats.total_events, stats.table_events) == (sum(stored.values()), sum(stored.values()))
    finally:
        restarted.send_signal(signal.SIGTERM)
        assert stopped(restarted, service_log(db)) == 0
        assert restarted.stdout is not None
        restarted.stdout.close()


def stopped(proc: subprocess.Popen[str], log: Path) -> int:
    """The exit code after SIGTERM; a service still running after 15 s is killed and the test fails with its
    log's tail (the story of a hang, which CI keeps only in its output)."""
    try:
        return proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise AssertionError(f"the memory service did not stop within 15 s of SIGTERM; its log ends:\n{tail}") from None

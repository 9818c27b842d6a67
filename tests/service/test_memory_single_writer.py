"""Two memory services on one database file: the second is refused at start-up, naming the first.

Both would otherwise serve and diverge (docs/resilience.md): each publishes only its own writes to its
Watch streams, numbers versions from the same start, and decays the counts on its own clock.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from calispec.v1 import memory_pb2, memory_pb2_grpc
from calispec_core.credentials import writer_metadata
from calispec_core.grpc_server import make_channel
from calispec_tools.stack import LocalStack, ServiceStartError, StackConfig, claim_log_dir
from tests.helpers import spawn_memory_service

TOKEN = "single-writer-test-token-0123456789"
OPEN = ["--allow-unauthenticated-writes"]  # refused before any write: no token needed


def start(db: Path, token_file: Path) -> tuple[subprocess.Popen[str], str]:
    """A service that serves; its address."""
    proc, line = spawn_memory_service(db, token_file)
    assert line.startswith("memory_service listening on"), proc.communicate()[1]
    return proc, line.split()[3]


def stop(proc: subprocess.Popen[str], sig: signal.Signals = signal.SIGTERM) -> None:
    proc.send_signal(sig)
    proc.communicate(timeout=30)


def record_durably(address: str, count: int) -> memory_pb2.RecordEventsResponse:
    with make_channel(address) as channel:
        request = memory_pb2.RecordEventsRequest(
            namespace="ns", events=[memory_pb2.PairCount(draft_token_id=1, target_token_id=2, count=count)],
            wait_durable=True,
        )  # fmt: skip
        return memory_pb2_grpc.MemoryServiceStub(channel).RecordEvents(
            request, metadata=writer_metadata(TOKEN, "w"), timeout=30
        )


def total_events(address: str) -> int:
    with make_channel(address) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        return stub.GetStats(memory_pb2.GetStatsRequest(namespace="ns"), timeout=30).total_events


def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN)
    return path


def test_a_second_service_on_the_same_database_is_refused_naming_the_first(tmp_path: Path) -> None:
    db = tmp_path / "memory.db"
    first, address = start(db, token(tmp_path))
    try:
        second, line = spawn_memory_service(db, token(tmp_path))
        if line:
            stop(second)
            pytest.fail(f"a second service serves the same database: {line}")
        _, stderr = second.communicate(timeout=60)
        assert second.returncode == 2, stderr
        lines = stderr.strip().splitlines()
        assert len(lines) == 1, stderr  # one line, no traceback
        assert lines[0].startswith(f"memory_service: cannot start: the memory database {db} is in use by another")
        assert f"pid {first.pid} on " in lines[0] and f"serving {address}" in lines[0]
        assert record_durably(address, 3).version == 1  # the first serves on, alone
    finally:
        stop(first)


def test_after_the_first_is_killed_a_new_one_takes_the_database(tmp_path: Path) -> None:
    db = tmp_path / "memory.db"
    first, address = start(db, token(tmp_path))
    record_durably(address, 5)
    stop(first, signal.SIGKILL)  # its lock goes with the process: nothing left to clean up
    second, address = start(db, token(tmp_path))
    try:
        assert total_events(address) == 5
    finally:
        stop(second)


def test_services_on_two_databases_coexist(tmp_path: Path) -> None:
    a, address_a = start(tmp_path / "a.db", token(tmp_path))
    try:
        b, address_b = start(tmp_path / "b.db", token(tmp_path))
        try:
            record_durably(address_a, 2)
            assert (total_events(address_a), total_events(address_b)) == (2, 0)
        finally:
            stop(b)
    finally:
        stop(a)


def test_a_stack_beside_another_on_the_same_database_says_why(tmp_path: Path) -> None:
    """`calispec demo` beside `calispec up` (both on the default memory.db): the demo's memory service, started
    first, is refused before any model loads, and the stack's error is that line."""
    up, address = start(tmp_path / "memory.db", token(tmp_path))
    config = StackConfig(tmp_path / "d", tmp_path / "t", tmp_path / "memory.db", tmp_path / "demo-logs")
    config.log_dir.mkdir()
    demo = LocalStack(config)
    demo._dir_lock = claim_log_dir(config.log_dir)  # what start() takes before it spawns
    try:
        with pytest.raises(ServiceStartError) as refused:
            demo._spawn("memory_service", ["--port", "0", "--db", str(config.memory_db), *OPEN])
    finally:
        demo.stop()
        stop(up)
    assert refused.value.line.startswith("memory_service: cannot start: the memory database")
    assert f"serving {address}" in refused.value.line and "(exit 2; log: " in refused.value.line

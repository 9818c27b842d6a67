"""MemoryService over a real gRPC channel: round trips, status codes, health, reflection, CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import sqlite_utils
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from calispec.grpc_server import make_channel, wait_for_ready
from calispec.v1 import memory_pb2, memory_pb2_grpc
from memory_service.config import MemoryConfig
from memory_service.server import SERVICE_NAME, create_server

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[grpc.Channel]:
    config = MemoryConfig(host="127.0.0.1", port=0, db_path=tmp_path / "memory.db", max_pairs_default=3)
    server, port, store = create_server(config)
    server.start()
    channel = make_channel(f"127.0.0.1:{port}")
    try:
        wait_for_ready(channel, timeout=10)
        yield channel
    finally:
        channel.close()
        server.stop(None).wait()
        store.close()


@pytest.fixture
def stub(channel: grpc.Channel) -> memory_pb2_grpc.MemoryServiceStub:
    return memory_pb2_grpc.MemoryServiceStub(channel)


def events(*triples: tuple[int, int, int]) -> list[memory_pb2.PairCount]:
    return [memory_pb2.PairCount(draft_token_id=d, target_token_id=t, count=c) for d, t, c in triples]


def as_triples(pairs: list[memory_pb2.PairCount]) -> list[tuple[int, int, int]]:
    return [(p.draft_token_id, p.target_token_id, p.count) for p in pairs]


def test_record_then_read_round_trip(stub: memory_pb2_grpc.MemoryServiceStub) -> None:
    first = stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 3))))
    assert (first.recorded, first.version) == (3, 1)
    second = stub.RecordEvents(
        memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 4), (5, 6, 2), (7, 8, 9)))
    )
    assert (second.recorded, second.version) == (15, 2)

    pairs = stub.GetPairs(memory_pb2.GetPairsRequest(namespace="ns", min_count=3, max_pairs=10))
    assert as_triples(pairs.pairs) == [(7, 8, 9), (1, 2, 7)]
    assert pairs.version == 2

    stats = stub.GetStats(memory_pb2.GetStatsRequest(namespace="ns"))
    assert (stats.total_events, stats.distinct_pairs, stats.version) == (18, 3, 2)


def test_max_pairs_zero_uses_the_server_default(stub: memory_pb2_grpc.MemoryServiceStub) -> None:
    triples = [(i, i, 10 + i) for i in range(5)]
    stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events(*triples)))
    reply = stub.GetPairs(memory_pb2.GetPairsRequest(namespace="ns"))
    assert as_triples(reply.pairs) == [(4, 4, 14), (3, 3, 13), (2, 2, 12)]  # fixture default is 3


def test_unknown_namespace_reads_empty(stub: memory_pb2_grpc.MemoryServiceStub) -> None:
    reply = stub.GetPairs(memory_pb2.GetPairsRequest(namespace="nobody"))
    assert (list(reply.pairs), reply.version) == ([], 0)


@pytest.mark.parametrize(
    ("call", "request_message", "code"),
    [
        ("RecordEvents", memory_pb2.RecordEventsRequest(namespace="", events=events((1, 2, 3))), "INVALID_ARGUMENT"),
        ("RecordEvents", memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 0))), "INVALID_ARGUMENT"),
        (
            "RecordEvents",
            memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 2**40 + 1))),
            "INVALID_ARGUMENT",
        ),
        (
            "RecordEvents",
            memory_pb2.RecordEventsRequest(namespace="ns", events=events(*[(1, 2, 1)] * 100_001)),
            "RESOURCE_EXHAUSTED",
        ),
        ("GetPairs", memory_pb2.GetPairsRequest(namespace="bad namespace"), "INVALID_ARGUMENT"),
        ("GetPairs", memory_pb2.GetPairsRequest(namespace="ns", max_pairs=2_000_000), "INVALID_ARGUMENT"),
        ("GetStats", memory_pb2.GetStatsRequest(namespace="x" * 129), "INVALID_ARGUMENT"),
    ],
    ids=["empty-namespace", "zero-count", "huge-count", "too-many-events", "bad-namespace", "max-pairs", "long-ns"],
)
def test_bad_input_maps_to_status(
    stub: memory_pb2_grpc.MemoryServiceStub, call: str, request_message: object, code: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        getattr(stub, call)(request_message)
    assert info.value.code() == getattr(grpc.StatusCode, code)
    assert info.value.details()  # the domain message reaches the client


def test_rejected_record_changes_nothing(stub: memory_pb2_grpc.MemoryServiceStub) -> None:
    stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 3))))
    with pytest.raises(grpc.RpcError) as info:
        stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 5), (3, 4, 0))))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    stats = stub.GetStats(memory_pb2.GetStatsRequest(namespace="ns"))
    assert (stats.total_events, stats.distinct_pairs, stats.version) == (3, 1, 1)


def test_health_reports_serving(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    reply = health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert SERVICE_NAME == "calispec.v1.MemoryService"
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_service(channel: grpc.Channel) -> None:
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for reply in replies for s in reply.list_services_response.service}
    assert "calispec.v1.MemoryService" in names


def test_cli_serves_and_shuts_down_cleanly_on_sigterm(tmp_path: Path) -> None:
    db_path = tmp_path / "cli.db"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "memory_service", "--port", "0", "--db", str(db_path), "--log-level", "WARNING"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # blocks until the server is listening (or the process dies)
        assert line.startswith("memory_service listening on 127.0.0.1:"), line + proc.stderr.read()
        address, db = line.split()[3], line.split()[4]
        assert db == f"db={db_path}"
        with make_channel(address) as channel:
            stub = memory_pb2_grpc.MemoryServiceStub(channel)
            reply = stub.RecordEvents(
                memory_pb2.RecordEventsRequest(namespace="cli", events=events((3, 4, 5))), timeout=10
            )
            assert reply.version == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    with sqlite_utils.Database(db_path) as db:  # the acknowledged write survived shutdown
        assert list(db["pair_counts"].rows) == [
            {"namespace": "cli", "draft_token_id": 3, "target_token_id": 4, "count": 5}
        ]

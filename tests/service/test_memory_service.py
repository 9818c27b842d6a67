"""MemoryService over a real gRPC channel: round trips, status codes, health, reflection, CLI."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
import sqlite_utils
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from calispec.v1 import memory_pb2, memory_pb2_grpc
from calispec_core.credentials import read_writer_scopes, read_writer_tokens, writer_metadata
from calispec_core.grpc_server import RETRY_PUSHBACK_METADATA, make_channel, wait_for_ready
from memory_service import store as store_module
from memory_service.config import MemoryConfig
from memory_service.server import SERVICE_NAME, create_server
from memory_service.store import MAX_TOTAL_EVENTS, CorrectionStore
from tests.helpers import spawn_memory_service, wait_until
from tests.metrics_scrape import scrape, total, value

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKEN = "test-writer-token-0123456789"
WRITER = writer_metadata(TOKEN, "test-writer")


class WriterStub:
    """The stub as a verifier uses it: writer token attached; writes wait for their commit so reads see them."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._stub = memory_pb2_grpc.MemoryServiceStub(channel)

    def RecordEvents(self, request: memory_pb2.RecordEventsRequest, **kwargs: object) -> object:
        request.wait_durable = True
        return self._stub.RecordEvents(request, metadata=WRITER, **kwargs)

    def __getattr__(self, name: str) -> object:
        return getattr(self._stub, name)


@contextmanager
def serving(config: MemoryConfig) -> Iterator[tuple[grpc.Channel, CorrectionStore]]:
    """A memory service of its own for one test: its channel and store, stopped and closed after."""
    server, port, store = create_server(config)
    server.start()
    channel = make_channel(f"127.0.0.1:{port}")
    try:
        yield channel, store
    finally:
        channel.close()
        server.stop(None).wait()
        store.close()


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[grpc.Channel]:
    config = MemoryConfig(
        host="127.0.0.1",
        port=0,
        db_path=tmp_path / "memory.db",
        max_pairs_default=3,
        flush_interval_s=0.05,
        writer_token=TOKEN,
        writer_events_per_s=1000,
        writer_burst_events=200_000,
        watch_heartbeat_s=0.2,
    )
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
    return WriterStub(channel)  # type: ignore[return-value]


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
    triples = [(i, i + 10, 10 + i) for i in range(5)]
    stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events(*triples)))
    reply = stub.GetPairs(memory_pb2.GetPairsRequest(namespace="ns"))
    assert as_triples(reply.pairs) == [(4, 14, 14), (3, 13, 13), (2, 12, 12)]  # fixture default is 3


def test_unknown_namespace_reads_empty(stub: memory_pb2_grpc.MemoryServiceStub) -> None:
    reply = stub.GetPairs(memory_pb2.GetPairsRequest(namespace="nobody"))
    assert (list(reply.pairs), reply.version) == ([], 0)


@pytest.mark.parametrize(
    ("call", "request_message", "code"),
    [
        ("RecordEvents", memory_pb2.RecordEventsRequest(namespace="", events=events((1, 2, 3))), "INVALID_ARGUMENT"),
        ("RecordEvents", memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 0))), "INVALID_ARGUMENT"),
        ("RecordEvents", memory_pb2.RecordEventsRequest(namespace="ns", events=events((3, 3, 1))), "INVALID_ARGUMENT"),
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
    ids=[
        "empty-namespace",
        "zero-count",
        "self-pair",
        "huge-count",
        "too-many-events",
        "bad-namespace",
        "max-pairs",
        "long-ns",
    ],
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


def test_reflection_calls_are_counted(tmp_path: Path) -> None:
    """The interceptor wrapped unary-response and unary-request handlers only: reflection's calls, which stream both
    ways, were in no calispec_rpc_* metric though they are documented as counted (not logged)."""
    server, port, store = create_server(MemoryConfig(port=0, db_path=tmp_path / "m.db", metrics_port=0))
    server.start()
    try:
        with make_channel(f"127.0.0.1:{port}") as channel:
            reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
            for _ in range(3):
                list(reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
        samples = scrape(server.metrics_url)
    finally:
        server.stop(None).wait()
        store.close()
    method = "ServerReflection/ServerReflectionInfo"
    assert value(samples, "calispec_rpc_requests_total", method=method, code="OK") == 3
    assert value(samples, "calispec_rpc_duration_seconds_count", method=method) == 3
    assert value(samples, "calispec_rpc_in_flight") == 0


@pytest.mark.parametrize(
    ("ending", "code"), [("cancel", "CANCELLED"), ("channel closed", "CANCELLED"), ("deadline", "DEADLINE_EXCEEDED")]
)
def test_a_reflection_call_ended_under_its_handler_is_counted_as_it_ended(
    tmp_path: Path, ending: str, code: str
) -> None:
    """A call streaming both ways that its client cancels, whose channel closes or whose deadline passes while the
    handler waits for its next request: the read raises a bare RpcError with no status set, which was counted UNKNOWN,
    as a bug is. Counted once, as its client saw it, or OK where the read ended as if the client had closed its stream
    and the handler returned before the call turned inactive (a race the server cannot see: tests/unit/
    test_rpc_status_label.py has each case without it)."""
    server, port, store = create_server(MemoryConfig(port=0, db_path=tmp_path / "m.db", metrics_port=0))
    server.start()
    method = "ServerReflection/ServerReflectionInfo"
    release = threading.Event()

    def requests() -> Iterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")
        release.wait(timeout=30)  # the stream stays open until the call ends

    def ended() -> dict | None:  # the call counted
        samples = scrape(server.metrics_url)
        return samples if total(samples, "calispec_rpc_requests_total") else None

    try:
        channel = make_channel(f"127.0.0.1:{port}")
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo(requests(), timeout=1.0 if ending == "deadline" else None)
        assert next(call).list_services_response.service  # the handler now reads the next request
        if ending == "cancel":
            call.cancel()
        elif ending == "channel closed":
            channel.close()
        samples = wait_until(ended)
        release.set()
        channel.close()
    finally:
        release.set()
        server.stop(None).wait()
        store.close()
    counted = {dict(k[1])["code"]: v for k, v in samples.items() if k[0] == "calispec_rpc_requests_total"}
    assert counted in ({code: 1}, {"OK": 1}), counted
    assert value(samples, "calispec_rpc_requests_total", method=method, code=next(iter(counted))) == 1


def test_cli_serves_and_shuts_down_cleanly_on_sigterm(tmp_path: Path) -> None:
    db_path = tmp_path / "cli.db"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    proc, line = spawn_memory_service(db_path, token_file)
    try:
        assert line.startswith("memory_service listening on 127.0.0.1:"), line + proc.stderr.read()
        address = line.split()[3]
        assert f" db={db_path}" in line  # not split on spaces: a TMPDIR may hold one (found by probing)
        with make_channel(address) as channel:
            stub = memory_pb2_grpc.MemoryServiceStub(channel)
            reply = stub.RecordEvents(
                memory_pb2.RecordEventsRequest(namespace="cli", events=events((3, 4, 5))), timeout=10, metadata=WRITER
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
            {"namespace": "cli", "draft_token_id": 3, "target_token_id": 4, "count": 5, "last_version": 1}
        ]


# -- only verifiers write -------------------------------------------------------------------------


@pytest.mark.parametrize("metadata", [(), writer_metadata("not-the-token-at-all"), (("authorization", TOKEN),)])
def test_write_without_the_writer_token_is_unauthenticated_and_changes_nothing(
    channel: grpc.Channel, stub: memory_pb2_grpc.MemoryServiceStub, metadata: tuple[tuple[str, str], ...]
) -> None:
    stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 3))))
    raw = memory_pb2_grpc.MemoryServiceStub(channel)
    request = memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 5)), wait_durable=True)
    with pytest.raises(grpc.RpcError) as info:
        raw.RecordEvents(request, metadata=metadata)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    stats = stub.GetStats(memory_pb2.GetStatsRequest(namespace="ns"))
    assert (stats.total_events, stats.version) == (3, 1)


def test_refused_writes_count_their_entries_as_dropped_not_the_counts_they_claim(tmp_path: Path) -> None:
    """Any client could inflate calispec_memory_events_dropped_total by 2^40 per entry of a refused write."""
    config = MemoryConfig(port=0, db_path=tmp_path / "m.db", writer_token=TOKEN, metrics_port=0)
    server, port, store = create_server(config)
    server.start()
    try:
        with make_channel(f"127.0.0.1:{port}") as channel:
            stub = memory_pb2_grpc.MemoryServiceStub(channel)
            big = events(*[(1, 2, 2**40)] * 3)
            refused = [  # a stranger's write, and a writer's with a count beyond 2^40
                (memory_pb2.RecordEventsRequest(namespace="ns", events=big), ()),
                (memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 2**41), (3, 4, 1))), WRITER),
            ]
            for request, metadata in refused:
                with pytest.raises(grpc.RpcError):
                    stub.RecordEvents(request, metadata=metadata)
        samples = scrape(server.metrics_url)
        assert value(samples, "calispec_memory_events_dropped_total", code="UNAUTHENTICATED") == 3
        assert value(samples, "calispec_memory_events_dropped_total", code="INVALID_ARGUMENT") == 2
    finally:
        server.stop(None).wait()
        store.close()


def test_a_writer_over_its_rate_limit_gets_resource_exhausted(stub: memory_pb2_grpc.MemoryServiceStub) -> None:
    stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 199_000))))
    with pytest.raises(grpc.RpcError) as info:  # burst is 200k events, refilled at 1000/s
        stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 5_000))))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    stats = stub.GetStats(memory_pb2.GetStatsRequest(namespace="ns"))
    assert stats.total_events == 199_000


def test_a_write_over_the_writers_share_of_the_next_commit_is_refused_with_a_pushback_and_costs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "MAX_PENDING_PER_WRITER", 10)
    config = MemoryConfig(
        port=0,
        db_path=tmp_path / "m.db",
        flush_interval_s=60,  # nothing commits during the test
        writer_token=TOKEN,
        writer_events_per_s=0.001,
        writer_burst_events=13,
    )
    with serving(config) as (channel, store):
        raw = memory_pb2_grpc.MemoryServiceStub(channel)
        share = memory_pb2.RecordEventsRequest(namespace="ns", events=events(*[(d, 10, 1) for d in range(10)]))
        raw.RecordEvents(share, metadata=WRITER)  # its whole share: 3 of the burst's 13 left
        more = memory_pb2.RecordEventsRequest(namespace="ns", events=events(*[(d, 20, 1) for d in range(3)]))
        with pytest.raises(grpc.RpcError) as info:
            raw.RecordEvents(more, metadata=WRITER)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "waiting for the next commit" in info.value.details()
        assert (RETRY_PUSHBACK_METADATA, "60000") in tuple(info.value.trailing_metadata())
        store.flush()
        raw.RecordEvents(more, metadata=WRITER)  # within the burst only if the refused try gave its 3 back


def test_a_retry_of_an_accepted_write_is_answered_however_full_the_writers_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "MAX_PENDING_PER_WRITER", 10)
    config = MemoryConfig(
        port=0, db_path=tmp_path / "m.db", flush_interval_s=60, writer_token=TOKEN, writer_events_per_s=0
    )
    with serving(config) as (channel, store):
        raw = memory_pb2_grpc.MemoryServiceStub(channel)
        first = memory_pb2.RecordEventsRequest(namespace="ns", events=events((9, 3, 1)), write_id="w-1")
        version = raw.RecordEvents(first, metadata=WRITER).version
        full = memory_pb2.RecordEventsRequest(namespace="ns", events=events(*[(d, 50, 1) for d in range(9)]))
        raw.RecordEvents(full, metadata=WRITER)
        with pytest.raises(grpc.RpcError) as info:  # the share is full (1 + 9)...
            raw.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((9, 4, 1))), metadata=WRITER)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert raw.RecordEvents(first, metadata=WRITER).version == version  # ...yet the retry is answered
        store.flush()
        assert store.stats("ns")[0] == 10  # and counted once


def test_a_new_writer_id_header_per_call_does_not_buy_a_new_rate_limit(channel: grpc.Channel) -> None:
    """The limit was keyed on x-calispec-writer-id: a fresh value per call admitted 12 M events in 0.01 s."""
    raw = memory_pb2_grpc.MemoryServiceStub(channel)
    codes = []
    for i in range(4):  # 4 x 150k events against a 200k burst, each call claiming another writer
        request = memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 150_000)), wait_durable=True)
        try:
            raw.RecordEvents(request, metadata=writer_metadata(TOKEN, f"writer-{i}"))
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            codes.append(exc.code())
    assert codes == [grpc.StatusCode.OK] + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 3
    assert WriterStub(channel).GetStats(memory_pb2.GetStatsRequest(namespace="ns")).total_events == 150_000


def test_each_identity_in_the_tokens_file_has_its_own_rate_limit(tmp_path: Path) -> None:
    tokens = (("target-0", "token-of-target-0-0123"), ("target-1", "token-of-target-1-0123"))
    config = MemoryConfig(
        port=0, db_path=tmp_path / "m.db", writer_tokens=tokens, writer_events_per_s=1, writer_burst_events=100
    )
    server, port, store = create_server(config)
    server.start()
    try:
        with make_channel(f"127.0.0.1:{port}") as channel:
            raw = memory_pb2_grpc.MemoryServiceStub(channel)
            write = memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 100)))
            raw.RecordEvents(write, metadata=writer_metadata("token-of-target-0-0123"))
            with pytest.raises(grpc.RpcError) as info:
                raw.RecordEvents(write, metadata=writer_metadata("token-of-target-0-0123"))
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "target-0" in info.value.details()
            raw.RecordEvents(write, metadata=writer_metadata("token-of-target-1-0123"))  # its own bucket
    finally:
        server.stop(None).wait()
        store.close()


def test_a_writer_confined_to_namespaces_cannot_write_another(tmp_path: Path) -> None:
    """Any writer token wrote, and could fix the vocabulary of, any namespace: the verifiers of one pair
    could count into another pair's table. A token file line may now name the namespaces its token writes."""
    path = tmp_path / "writers"
    path.write_text("pair-a token-of-pair-a-0123456 pair/a+* other/a\nadmin token-of-the-admin-01234\n")
    tokens, scopes = read_writer_tokens(path), read_writer_scopes(path)
    config = MemoryConfig(port=0, db_path=tmp_path / "m.db", writer_tokens=tokens, writer_scopes=scopes)
    server, port, store = create_server(config)
    server.start()
    try:
        with make_channel(f"127.0.0.1:{port}") as channel:
            raw = memory_pb2_grpc.MemoryServiceStub(channel)

            def write(namespace: str, token: str) -> None:
                request = memory_pb2.RecordEventsRequest(
                    namespace=namespace, events=events((1, 2, 3)), vocab_size=50, wait_durable=True
                )
                raw.RecordEvents(request, metadata=writer_metadata(token))

            write("pair/a+target-1", "token-of-pair-a-0123456")
            write("other/a", "token-of-pair-a-0123456")
            for namespace in ("pair/b+target-1", "other/ab", "pair/a"):
                with pytest.raises(grpc.RpcError) as info:
                    write(namespace, "token-of-pair-a-0123456")
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "pair-a" in info.value.details() and namespace in info.value.details()
                stats = raw.GetStats(memory_pb2.GetStatsRequest(namespace=namespace))
                assert stats.total_events == 0 and stats.vocab_size == 0  # nothing counted, no vocabulary fixed
            write("pair/b+target-1", "token-of-the-admin-01234")  # a line without namespaces: every one
            assert raw.GetStats(memory_pb2.GetStatsRequest(namespace="pair/b+target-1")).total_events == 3
    finally:
        server.stop(None).wait()
        store.close()


def test_a_write_the_store_refuses_gives_its_writer_budget_back(tmp_path: Path) -> None:
    """A write the store refused after the rate limit took its events (here: the namespace's total count
    would overflow) kept the charge: the writer's next, valid write was refused as over its limit."""
    db_path = tmp_path / "m.db"
    with CorrectionStore(db_path, flush_interval_s=0) as seeding:
        seeding.record("full", [(1, 2, 1)], durable=True)
    with sqlite_utils.Database(db_path) as db:  # one event away from the namespace's cap
        db.execute("UPDATE namespace_versions SET total_events = ?", (MAX_TOTAL_EVENTS - 1,))
    config = MemoryConfig(port=0, db_path=db_path, writer_token=TOKEN, writer_events_per_s=1, writer_burst_events=100)
    server, port, store = create_server(config)
    server.start()
    try:
        with make_channel(f"127.0.0.1:{port}") as channel:
            stub = WriterStub(channel)
            with pytest.raises(grpc.RpcError, match="overflow") as info:
                stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="full", events=events((1, 2, 100))))
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            reply = stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 100))))
            assert reply.recorded == 100  # the whole burst was still there
    finally:
        server.stop(None).wait()
        store.close()


# -- insight and watch ----------------------------------------------------------------------------


def test_stats_rpc_reports_top_pairs_share_and_distribution(stub: memory_pb2_grpc.MemoryServiceStub) -> None:
    triples = [(1, 11, 60), (2, 12, 20), (3, 13, 10), (4, 14, 5), (5, 15, 2), (6, 16, 1), (7, 17, 1), (8, 18, 1)]
    stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events(*triples)))
    stats = stub.GetStats(memory_pb2.GetStatsRequest(namespace="ns", top_k=2))
    assert as_triples(stats.top_pairs) == [(1, 11, 60), (2, 12, 20)]
    assert stats.top20_share == pytest.approx(80 / 100)  # top 20% of 8 pairs = 2 pairs
    assert (stats.table_events, stats.distinct_pairs) == (100, 8)
    assert [(b.min_count, b.pairs) for b in stats.count_histogram] == [(1, 3), (2, 1), (4, 1), (8, 1), (16, 1), (32, 1)]
    assert stats.db_bytes > 0 and stats.max_pairs == 65_536


def test_watch_sends_snapshot_then_deltas_and_resumes(stub: memory_pb2_grpc.MemoryServiceStub) -> None:
    stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 3))))
    stream = stub.Watch(memory_pb2.WatchRequest(namespace="ns"), timeout=10)
    first = next(stream)
    assert (first.kind, first.version, as_triples(first.pairs), first.last_chunk) == (
        memory_pb2.WATCH_UPDATE_KIND_SNAPSHOT, 1, [(1, 2, 3)], True
    )  # fmt: skip
    stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 1), (5, 6, 7))))
    update = next(u for u in stream if u.kind != memory_pb2.WATCH_UPDATE_KIND_HEARTBEAT)
    assert (update.kind, update.version, as_triples(update.pairs)) == (
        memory_pb2.WATCH_UPDATE_KIND_DELTA, 2, [(1, 2, 4), (5, 6, 7)]
    )  # fmt: skip
    stream.cancel()
    stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((9, 10, 1))))
    resumed = stub.Watch(memory_pb2.WatchRequest(namespace="ns", resume_version=2), timeout=10)
    update = next(resumed)  # the missed write, not a snapshot
    assert (update.kind, update.version, as_triples(update.pairs)) == (
        memory_pb2.WATCH_UPDATE_KIND_DELTA, 3, [(9, 10, 1)]
    )  # fmt: skip
    resumed.cancel()


def test_the_first_declared_vocabulary_bounds_every_later_write(channel: grpc.Channel, tmp_path: Path) -> None:
    """One out-of-range pair used to reach every verifier's table; now it is refused at the door."""
    stub = WriterStub(channel)
    stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 3)), vocab_size=100))
    with pytest.raises(grpc.RpcError) as info:  # a later writer that declares nothing: still bounded
        stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((4, 5, 1), (7, 100, 1))))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "[0, 99]" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:  # another model pair's vocabulary
        stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((4, 5, 1)), vocab_size=50))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as info:
        next(iter(stub.Watch(memory_pb2.WatchRequest(namespace="ns", vocab_size=50), timeout=5)))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    stats = stub.GetStats(memory_pb2.GetStatsRequest(namespace="ns"))
    assert (stats.total_events, stats.distinct_pairs, stats.vocab_size) == (3, 1, 100)  # nothing changed


def test_a_reader_cannot_fix_a_namespaces_vocabulary(channel: grpc.Channel, tmp_path: Path) -> None:
    """Watch needs no writer token: a stream that declared a fresh namespace's vocabulary locked every
    verifier of another vocabulary size out of it for good."""
    reader = memory_pb2_grpc.MemoryServiceStub(channel)  # no writer token
    stream = reader.Watch(memory_pb2.WatchRequest(namespace="fresh", vocab_size=50), timeout=10)
    next(iter(stream))  # the stream is served...
    stream.cancel()
    assert reader.GetStats(memory_pb2.GetStatsRequest(namespace="fresh")).vocab_size == 0  # ...and declares nothing
    writer = WriterStub(channel)
    writer.RecordEvents(memory_pb2.RecordEventsRequest(namespace="fresh", events=events((1, 2, 3)), vocab_size=100))
    assert reader.GetStats(memory_pb2.GetStatsRequest(namespace="fresh")).vocab_size == 100


def test_a_refused_first_write_declares_no_vocabulary(stub: memory_pb2_grpc.MemoryServiceStub) -> None:
    with pytest.raises(grpc.RpcError):
        stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 200, 1)), vocab_size=100))
    assert stub.GetStats(memory_pb2.GetStatsRequest(namespace="ns")).vocab_size == 0
    stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 200, 1)), vocab_size=300))
    assert stub.GetStats(memory_pb2.GetStatsRequest(namespace="ns")).vocab_size == 300


def watch_slot_free(stub: memory_pb2_grpc.MemoryServiceStub) -> bool:
    """A Watch stream opens (and is closed again): a slot was free."""
    try:
        stream = stub.Watch(memory_pb2.WatchRequest(namespace="ns"), timeout=30)
        next(stream)
    except grpc.RpcError:
        return False
    stream.cancel()
    return True


def test_watch_streams_beyond_the_limit_are_refused_and_leave_the_writes_their_workers(tmp_path: Path) -> None:
    """Each stream holds a worker for its life: one client opening as many streams as workers queued every
    verifier's RecordEvents behind them (its timeout fired, and a late retry counted twice)."""
    config = MemoryConfig(port=0, db_path=tmp_path / "memory.db", writer_token=TOKEN, max_workers=3,
                          max_watch_streams=1, watch_heartbeat_s=0.2)  # fmt: skip
    with serving(config) as (channel, _):
        reader = memory_pb2_grpc.MemoryServiceStub(channel)
        first = reader.Watch(memory_pb2.WatchRequest(namespace="ns"), timeout=30)
        next(first)
        with pytest.raises(grpc.RpcError) as info:
            next(reader.Watch(memory_pb2.WatchRequest(namespace="ns"), timeout=30))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        WriterStub(channel).RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 3))),
                                         timeout=10)  # fmt: skip
        first.cancel()

        wait_until(lambda: watch_slot_free(reader))  # the slot comes back once the cancelled stream has ended


def test_a_watch_client_that_stopped_reading_frees_its_slot_at_the_streams_age_limit(tmp_path: Path) -> None:
    """A client frozen with its connection open (SIGSTOP, a node gone without a FIN) held its Watch slot for good:
    its heartbeats went into buffers (found by probing; server keepalive did not end it). Streams now end (OK)
    after their age limit, so the slot comes back without the client doing anything."""
    config = MemoryConfig(port=0, db_path=tmp_path / "memory.db", writer_token=TOKEN, max_workers=3,
                          max_watch_streams=1, watch_heartbeat_s=0.05, watch_max_age_s=0.2)  # fmt: skip
    with serving(config) as (channel, _):
        reader = memory_pb2_grpc.MemoryServiceStub(channel)
        frozen = reader.Watch(memory_pb2.WatchRequest(namespace="ns"), timeout=60)
        next(frozen)  # and never again

        wait_until(lambda: watch_slot_free(reader))
        frozen.cancel()


def test_a_watch_client_that_stopped_reading_while_deltas_filled_its_window_frees_its_slot(tmp_path: Path) -> None:
    """Deltas fill a stream's flow-control window when its client stopped reading, and then the server's send
    waits for good, so the stream never looks at its clock: a reaper cancels it a quarter of its age later."""
    config = MemoryConfig(port=0, db_path=tmp_path / "memory.db", writer_token=TOKEN, max_workers=3,
                          max_watch_streams=1, flush_interval_s=0.05, watch_max_age_s=3.0)  # fmt: skip
    server, port, store = create_server(config)
    server.start()
    # a window that stays at HTTP/2's 64 KiB (a client that reads grows it to megabytes)
    frozen_channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.http2.bdp_probe", 0)])
    try:
        reader = memory_pb2_grpc.MemoryServiceStub(frozen_channel)
        frozen = reader.Watch(memory_pb2.WatchRequest(namespace="ns"), timeout=120)
        next(frozen)  # and never again
        with make_channel(f"127.0.0.1:{port}") as channel:
            for count in range(1, 5):  # 4 deltas of 20,000 pairs: about 200 KB each
                request = memory_pb2.RecordEventsRequest(
                    namespace="ns", events=events(*((d + 1, 0, count) for d in range(20_000)))
                )
                WriterStub(channel).RecordEvents(request)
            assert store.committed_version("ns") >= 4

            wait_until(lambda: watch_slot_free(memory_pb2_grpc.MemoryServiceStub(channel)), timeout_s=60)
        frozen.cancel()
    finally:
        frozen_channel.close()
        server.stop(None).wait()
        store.close()


def test_readers_without_a_token_cannot_take_every_watch_slot(tmp_path: Path) -> None:
    """A Watch needs no token: one client that opened streams and never read them held every slot (probed: 56
    of 56), and a verifier reconnecting its memory link was refused. Readers now have half the slots."""
    config = MemoryConfig(port=0, db_path=tmp_path / "memory.db", writer_token=TOKEN, max_workers=8,
                          max_watch_streams=4, watch_heartbeat_s=0.2)  # fmt: skip
    with serving(config) as (channel, _):
        reader = memory_pb2_grpc.MemoryServiceStub(channel)
        held, refused = [], None
        for _ in range(4):
            stream = reader.Watch(memory_pb2.WatchRequest(namespace="ns"), timeout=30)
            try:
                next(stream)
            except grpc.RpcError as exc:
                refused = exc
                break
            held.append(stream)
        assert len(held) == 2 and refused is not None and refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "without a writer token" in refused.details()
        verifier = reader.Watch(memory_pb2.WatchRequest(namespace="ns"), timeout=30, metadata=WRITER)
        assert next(verifier).kind is not None  # a slot left for the verifiers
        for stream in [*held, verifier]:
            stream.cancel()


def test_the_watch_stream_limit_leaves_workers_for_calls() -> None:
    assert MemoryConfig(max_workers=64).watch_stream_limit() == 56
    assert MemoryConfig(max_workers=4).watch_stream_limit() == 2
    with pytest.raises(ValueError):
        MemoryConfig(max_workers=4, max_watch_streams=4)


def test_a_conditional_write_lands_only_in_a_namespace_that_never_recorded(channel: grpc.Channel) -> None:
    """How a calibration is seeded once however many seeders race: the second is refused and changes nothing."""
    stub = WriterStub(channel)
    seed = memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 9)), only_if_empty=True)
    assert stub.RecordEvents(seed).recorded == 9
    with pytest.raises(grpc.RpcError) as info:
        stub.RecordEvents(seed)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "already holds counts" in info.value.details()
    stub.RecordEvents(memory_pb2.RecordEventsRequest(namespace="ns", events=events((1, 2, 1))))  # plain writes go on
    other = memory_pb2.RecordEventsRequest(namespace="other", events=events((3, 4, 2)), only_if_empty=True)
    assert stub.RecordEvents(other).recorded == 2
    stats = stub.GetStats(memory_pb2.GetStatsRequest(namespace="ns"))
    assert stats.total_events == 10

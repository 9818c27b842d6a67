"""A verifier's MemoryLink against a real memory service: watch, ship with the token, survive outages."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2

from calispec.v1 import memory_pb2, memory_pb2_grpc
from calispec_core.credentials import read_writer_scopes, read_writer_tokens, writer_metadata
from calispec_core.grpc_server import RETRY_PUSHBACK_METADATA, make_channel
from memory_service import store as store_module
from memory_service.config import MemoryConfig
from memory_service.server import create_server
from memory_service.store import CorrectionStore
from target_service.memory_link import MAX_FLUSH_EVENTS, MEMORY_HEALTH_SERVICE, MemoryLink
from target_service.pair_table import PairTable
from tests.helpers import wait_until

TOKEN = "link-test-writer-token-0123456789"
FLUSH_S = 0.05
LAMBDA = 6


@dataclass
class Memory:
    server: grpc.Server
    port: int
    store: CorrectionStore

    def stop(self) -> None:
        self.store.hub.close()
        self.server.stop(None).wait()
        self.store.close()


def start_memory(
    db: Path, port: int = 0, burst: float | None = None, rate: float | None = None, watch_max_age_s: float = 600.0
) -> Memory:
    config = MemoryConfig(port=port, db_path=db, flush_interval_s=FLUSH_S, writer_token=TOKEN, watch_heartbeat_s=0.2,
                          writer_burst_events=burst, watch_max_age_s=watch_max_age_s)  # fmt: skip
    if rate is not None:
        config = replace(config, writer_events_per_s=rate)
    server, bound, store = create_server(config)
    server.start()
    return Memory(server, bound, store)


class FakeHealth:
    def __init__(self) -> None:
        self.status: dict[str, int] = {}

    def set(self, name: str, status: int) -> None:
        self.status[name] = status


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    m = start_memory(tmp_path / "memory.db")
    yield m
    m.stop()


def count(table: PairTable, draft: int, target: int) -> int:
    return int(table.counts(torch.tensor([draft]), torch.tensor([target]))[0])


def record_elsewhere(port: int, *triples: tuple[int, int, int]) -> None:
    """Another verifier's writes."""
    with make_channel(f"127.0.0.1:{port}") as channel:
        events = [memory_pb2.PairCount(draft_token_id=d, target_token_id=t, count=c) for d, t, c in triples]
        memory_pb2_grpc.MemoryServiceStub(channel).RecordEvents(
            memory_pb2.RecordEventsRequest(namespace="ns", events=events), metadata=writer_metadata(TOKEN, "other")
        )


def make_link(port: int, table: PairTable, token: str | None = TOKEN) -> tuple[MemoryLink, FakeHealth]:
    link = MemoryLink(f"127.0.0.1:{port}", "ns", table, sync_interval_s=0.05, writer_token=token, writer_id="t1")
    health = FakeHealth()
    link.report_health(health)  # type: ignore[arg-type]
    link.start()
    return link, health


def test_pair_becomes_rescuable_within_one_refresh(memory: Memory) -> None:
    table = PairTable(vocab_size=100)
    link, health = make_link(memory.port, table)
    try:
        wait_until(lambda: link.connected)
        assert health.status[MEMORY_HEALTH_SERVICE] == health_pb2.HealthCheckResponse.SERVING
        record_elsewhere(memory.port, (5, 7, LAMBDA + 1))
        memory.store.flush()  # the one commit that holds the write (if the timer did not commit it already)
        committed = memory.store.committed_version("ns")
        # pushed by the Watch stream as that commit's delta: no polling period, no further write needed
        wait_until(lambda: count(table, 5, 7) > LAMBDA)
        assert table.version == committed
    finally:
        link.stop()


def test_a_watch_stream_the_service_ends_is_resumed_without_a_disconnection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The memory service ends Watch streams at their age limit: each end logged "memory service disconnected" (a
    WARNING) and flipped the verifier's health until the next heartbeat. A clean end now resumes quietly."""
    memory = start_memory(tmp_path / "memory.db", watch_max_age_s=0.05)
    table = PairTable(vocab_size=100)
    link, health = make_link(memory.port, table)
    try:
        wait_until(lambda: link.connected)
        caplog.set_level(logging.INFO, logger="target_service.memory_link")
        caplog.clear()
        wait_until(lambda: link.status().reconnects >= 3)  # three streams ended by the service, resumed
        record_elsewhere(memory.port, (5, 7, 2))
        memory.store.flush()
        wait_until(lambda: count(table, 5, 7) == 2)  # the resumed stream still delivers
        assert link.connected and health.status[MEMORY_HEALTH_SERVICE] == health_pb2.HealthCheckResponse.SERVING
        assert [r.getMessage() for r in caplog.records if r.name == "target_service.memory_link"] == []
    finally:
        link.stop()
        memory.stop()


def test_streams_that_end_before_any_message_are_no_sign_of_health(tmp_path: Path) -> None:
    """A clean end resumes as connected, but one without a single message (a server that ends every stream at once)
    looped at 20 Hz with the health green (found by the review): it counts as a failure, with its backoff."""
    memory = start_memory(tmp_path / "memory.db", watch_max_age_s=0.3)  # the live stream ends cleanly soon
    table = PairTable(vocab_size=100)
    link, health = make_link(memory.port, table)
    try:
        wait_until(lambda: link.connected)
        stub = link._stub

        class EndsAtOnce:
            def __getattr__(self, name: str) -> object:
                return getattr(stub, name)

            def Watch(self, *_args: object, **_kwargs: object) -> Ended:
                return Ended()

        class Ended:  # a call that ended cleanly before any message
            def __iter__(self) -> Iterator[object]:
                return iter(())

            def cancel(self) -> None:
                pass

        link._stub = EndsAtOnce()  # type: ignore[assignment]  # the live stream's successors end at once
        wait_until(lambda: not link.connected)
        assert health.status[MEMORY_HEALTH_SERVICE] == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        link.stop()
        memory.stop()


def test_local_events_are_shipped_with_the_token_and_not_double_counted(memory: Memory) -> None:
    table = PairTable(vocab_size=100)
    link, _ = make_link(memory.port, table)
    try:
        table.add_local(torch.tensor([1, 1, 2]), torch.tensor([3, 3, 4]))
        wait_until(lambda: memory.store.stats("ns")[0] == 3)
        wait_until(lambda: table.stats().local_events == 0)  # covered by the installed table now
        assert (count(table, 1, 3), count(table, 2, 4)) == (2, 1)
    finally:
        link.stop()


def test_verifier_without_the_token_cannot_write_and_says_so(memory: Memory) -> None:
    table = PairTable(vocab_size=100)
    link, _health = make_link(memory.port, table, token=None)
    try:
        table.add_local(torch.tensor([1]), torch.tensor([3]))
        wait_until(lambda: link.status().flush_failures > 0)
        assert not link.connected
        assert memory.store.stats("ns")[0] == 0
        assert count(table, 1, 3) == 1  # still counted locally, retried later
    finally:
        link.stop()


def test_outage_keeps_the_last_table_reports_it_and_resumes(tmp_path: Path) -> None:
    memory = start_memory(tmp_path / "memory.db")
    table = PairTable(vocab_size=100)
    link, health = make_link(memory.port, table)
    try:
        record_elsewhere(memory.port, (5, 7, 9))
        wait_until(lambda: count(table, 5, 7) == 9)
        memory.stop()
        wait_until(lambda: not link.connected)
        assert health.status[MEMORY_HEALTH_SERVICE] == health_pb2.HealthCheckResponse.NOT_SERVING
        table.add_local(torch.tensor([5]), torch.tensor([7]))  # verification goes on during the outage
        assert count(table, 5, 7) == 10
        memory = start_memory(tmp_path / "memory.db", port=memory.port)
        wait_until(lambda: link.connected, timeout_s=15)
        wait_until(lambda: memory.store.stats("ns")[0] == 10)  # the outage's events were shipped
        wait_until(lambda: count(table, 5, 7) == 10 and table.stats().local_events == 0)
        assert health.status[MEMORY_HEALTH_SERVICE] == health_pb2.HealthCheckResponse.SERVING
    finally:
        link.stop()
        memory.stop()


def test_one_out_of_vocabulary_pair_does_not_cut_the_verifier_off(memory: Memory) -> None:
    """A namespace written before it had a vocabulary may hold ids this verifier cannot use: skip them."""
    record_elsewhere(memory.port, (5, 7, LAMBDA + 1), (5, 2**32 - 1, 3))  # no vocabulary declared yet
    memory.store.flush()
    table = PairTable(vocab_size=100)
    link, health = make_link(memory.port, table)
    try:
        wait_until(lambda: link.connected and count(table, 5, 7) > LAMBDA)
        assert health.status[MEMORY_HEALTH_SERVICE] == health_pb2.HealthCheckResponse.SERVING
        assert table.stats().skipped_pairs == 1
        assert memory.store.table_stats("ns").vocab_size == 0  # a read (Watch) declares nothing...
        table.add_local(torch.tensor([1]), torch.tensor([2]))
        wait_until(lambda: memory.store.table_stats("ns").vocab_size == 100)  # ...the verifier's first write does
    finally:
        link.stop()


def test_a_backlog_larger_than_one_write_allows_still_reaches_the_memory(tmp_path: Path) -> None:
    """After a long outage the backlog went as one write over the writer's burst (or 100,000 pairs), was
    refused whole, went back, and grew: every later flush was refused for good."""
    memory = start_memory(tmp_path / "memory.db", burst=10)
    table = PairTable(vocab_size=100)
    link, _ = make_link(memory.port, table)
    try:
        table.add_local(torch.arange(20) % 7, torch.arange(20) % 5 + 7)  # 20 events: twice the burst
        wait_until(lambda: memory.store.stats("ns")[0] == 20)
        wait_until(lambda: table.stats().local_events == 0)
        assert link.status().flush_failures >= 1  # the first, whole write was refused
    finally:
        link.stop()
        memory.stop()


class LostReply(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return "the reply was lost (test)"


class LoseFirstReply:
    """The memory service's stub, but the first RecordEvents' reply is lost after the service took it."""

    def __init__(self, stub: memory_pb2_grpc.MemoryServiceStub) -> None:
        self._stub = stub
        self.requests: list[memory_pb2.RecordEventsRequest] = []

    def RecordEvents(
        self, request: memory_pb2.RecordEventsRequest, **kwargs: object
    ) -> memory_pb2.RecordEventsResponse:
        self.requests.append(request)
        reply = self._stub.RecordEvents(request, **kwargs)
        if len(self.requests) == 1:
            raise LostReply()
        return reply


def unstarted_link(memory: Memory, stub_type: type[LoseFirstReply]) -> tuple[PairTable, MemoryLink, LoseFirstReply]:
    """A link whose flushes the test calls itself, over a stub that loses replies."""
    table = PairTable(vocab_size=100)
    link = MemoryLink(f"127.0.0.1:{memory.port}", "ns", table, writer_token=TOKEN, writer_id="t1")
    stub = stub_type(link._stub)
    link._stub = stub  # type: ignore[assignment]
    return table, link, stub


def test_a_write_whose_reply_was_lost_is_sent_again_as_it_was_and_counted_once(memory: Memory) -> None:
    """Before write ids the link put the events back and sent them again: the service counted them twice."""
    table, link, stub = unstarted_link(memory, LoseFirstReply)
    try:
        table.add_local(torch.tensor([1, 1, 2]), torch.tensor([3, 3, 4]))
        assert not link.flush()  # the service took it, the reply was lost
        table.add_local(torch.tensor([5]), torch.tensor([6]))  # verification goes on meanwhile
        assert link.flush()
        first, retry, new = stub.requests
        assert retry == first and first.write_id  # the same write, the same id: not merged with newer events
        assert new.write_id != first.write_id and [(e.draft_token_id, e.count) for e in new.events] == [(5, 1)]
        memory.store.flush()
        assert memory.store.stats("ns")[0] == 4  # 3 + 1: the lost reply's write counted once
        assert not table.in_flight()
    finally:
        link.stop()


class Refused(LostReply):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.RESOURCE_EXHAUSTED


class LoseFirstReplyThenRefuse(LoseFirstReply):
    """The first reply is lost after the service took the write; the second try is refused over the rate."""

    refusal: type[grpc.RpcError] = Refused

    def RecordEvents(
        self, request: memory_pb2.RecordEventsRequest, **kwargs: object
    ) -> memory_pb2.RecordEventsResponse:
        if len(self.requests) == 1:
            self.requests.append(request)
            raise self.refusal()
        return super().RecordEvents(request, **kwargs)


def test_a_retry_of_a_counted_write_is_answered_even_over_the_writers_rate(tmp_path: Path) -> None:
    """The service charged a retry before it looked at its write_id, so a retry of a write that had used up the
    writer's burst was refused (and the writer then sent its events again under a new id)."""
    memory = start_memory(tmp_path / "memory.db", burst=3, rate=1e-3)  # no refill within the test
    try:
        with make_channel(f"127.0.0.1:{memory.port}") as channel:
            stub = memory_pb2_grpc.MemoryServiceStub(channel)
            events = [memory_pb2.PairCount(draft_token_id=1, target_token_id=2, count=3)]
            request = memory_pb2.RecordEventsRequest(namespace="ns", events=events, write_id="w1")
            first = stub.RecordEvents(request, metadata=writer_metadata(TOKEN, "t1"))  # uses the whole burst
            retry = stub.RecordEvents(request, metadata=writer_metadata(TOKEN, "t1"))
        assert (retry.recorded, retry.version) == (first.recorded, first.version) == (3, 1)
        memory.store.flush()
        assert memory.store.stats("ns")[0] == 3
    finally:
        memory.stop()


def test_a_write_with_an_id_is_digested_once(memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The service sorted and hashed a write's events twice (the retry check before the rate charge, then the
    record): a few ms for a verifier's write of 10k pairs, on the RPC's path."""
    import memory_service.server as memory_server
    from memory_service import write_ids

    digests: list[int] = []
    digest = write_ids.events_digest

    def counted(events: list[tuple[int, int, int]]) -> str:
        digests.append(len(events))
        return digest(events)

    monkeypatch.setattr(memory_server, "events_digest", counted)
    monkeypatch.setattr(write_ids, "events_digest", counted)
    with make_channel(f"127.0.0.1:{memory.port}") as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        events = [memory_pb2.PairCount(draft_token_id=1, target_token_id=d, count=1) for d in (2, 3)]
        request = memory_pb2.RecordEventsRequest(namespace="ns", events=events, write_id="w1")
        stub.RecordEvents(request, metadata=writer_metadata(TOKEN, "t1"))
        assert digests == [2]
        retry = stub.RecordEvents(request, metadata=writer_metadata(TOKEN, "t1"))
    assert retry.recorded == 2 and digests == [2, 2]
    memory.store.flush()
    assert memory.store.stats("ns")[0] == 2


class CodesSeen:
    """The link's stub, noting each RecordEvents' status code."""

    def __init__(self, stub: memory_pb2_grpc.MemoryServiceStub) -> None:
        self._stub = stub
        self.codes: list[grpc.StatusCode] = []

    def RecordEvents(self, request: memory_pb2.RecordEventsRequest, **kwargs: object) -> object:
        try:
            reply = self._stub.RecordEvents(request, **kwargs)
        except grpc.RpcError as exc:
            self.codes.append(exc.code())
            raise
        self.codes.append(grpc.StatusCode.OK)
        return reply

    def __getattr__(self, name: str) -> object:
        return getattr(self._stub, name)


@pytest.fixture
def share_of_three(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, CorrectionStore]]:
    """A memory service whose writers' share of a commit is 3 entries, and that commits only when told (by hand)."""
    monkeypatch.setattr(store_module, "MAX_PENDING_PER_WRITER", 3)
    config = MemoryConfig(port=0, db_path=tmp_path / "m.db", flush_interval_s=60, writer_token=TOKEN)
    server, port, store = create_server(config)
    server.start()
    try:
        yield port, store
    finally:
        server.stop(None).wait()
        store.close()


def test_a_write_deferred_by_the_writers_share_is_no_failure_and_keeps_its_size(
    share_of_three: tuple[int, CorrectionStore],
) -> None:
    """The link took the memory's "later" (its identity's share of the next commit full, e.g. an import by the same
    token) as a failed write: it halved its writes and reported the memory service down (found by review)."""
    port, store = share_of_three
    table = PairTable(vocab_size=100)
    link, health = make_link(port, table)
    seen = link._stub = CodesSeen(link._stub)  # type: ignore[assignment]
    try:
        table.add_local(torch.tensor([1, 2, 3]), torch.tensor([4, 4, 4]))
        wait_until(lambda: grpc.StatusCode.OK in seen.codes)  # sent: the share is full until the next commit
        table.add_local(torch.tensor([5]), torch.tensor([6]))
        wait_until(lambda: grpc.StatusCode.RESOURCE_EXHAUSTED in seen.codes)  # deferred
        assert link.status().flush_failures == 0 and link._flush_events == MAX_FLUSH_EVENTS
        assert health.status[MEMORY_HEALTH_SERVICE] == health_pb2.HealthCheckResponse.SERVING
        # commits (here by hand): the deferred event goes with a later flush of the link
        wait_until(lambda: store.flush() is not None and store.stats("ns")[0] == 4)
        assert link.status().flush_failures == 0
    finally:
        link.stop()


class RefusedLater(Refused):
    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((RETRY_PUSHBACK_METADATA, "1"),)


class LoseFirstReplyThenPushBack(LoseFirstReplyThenRefuse):
    """The first reply is lost after the service took the write; the resend is asked to wait (a pushback)."""

    refusal = RefusedLater


@pytest.mark.parametrize(
    ("stub_kind", "resend_fails"), [(LoseFirstReplyThenRefuse, True), (LoseFirstReplyThenPushBack, False)]
)
def test_a_refused_resend_of_a_write_that_may_have_counted_stays_the_same_write(
    memory: Memory, stub_kind: type[LoseFirstReply], resend_fails: bool
) -> None:
    """A refusal of the resend does not show that the first try was not counted: putting the events back sent them
    again under a new id, and the service counted them twice. A pushback on it (a "later") is no failure either (it
    was one: found by review): the same write goes with the next flush, and the link stays up."""
    table, link, stub = unstarted_link(memory, stub_kind)
    try:
        table.add_local(torch.tensor([1, 1, 2]), torch.tensor([3, 3, 4]))
        assert not link.flush()  # taken, reply lost
        assert link.flush() is not resend_fails  # the resend refused, or asked to wait
        assert link.flush()  # the same write again: answered
        assert len({r.write_id for r in stub.requests}) == 1 and len(stub.requests) == 3
        memory.store.flush()
        assert memory.store.stats("ns")[0] == 3
    finally:
        link.stop()


@pytest.mark.parametrize("deferred", [False, True])
def test_stop_warns_of_events_never_recorded_only(
    deferred: bool, share_of_three: tuple[int, CorrectionStore], caplog: pytest.LogCaptureFixture
) -> None:
    """Events the memory acknowledged but the watcher has not brought back yet are recorded: no warning for them (a
    first fix warned of every local event); a pushback on the last flush leaves events unsent, and those are named."""
    port, _ = share_of_three
    table = PairTable(vocab_size=100)
    link, _ = make_link(port, table)
    table.add_local(torch.tensor([1, 2, 3]), torch.tensor([4, 4, 4]))
    wait_until(lambda: table.unsent_events() == 0)  # acknowledged, not committed: still local
    if deferred:  # the share is full until a commit that never comes in this test
        table.add_local(torch.tensor([5]), torch.tensor([6]))
    with caplog.at_level("WARNING", logger="target_service.memory_link"):
        link.stop()
    assert table.stats().local_events > 0
    assert any("never recorded" in r.getMessage() for r in caplog.records) is deferred


def _link_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "target_service.memory_link"]


def test_a_link_that_never_comes_up_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing listening at --memory-addr: the target served for good without a word about its memory (it logged
    only changes of state, and it started "not connected"; found by probing)."""
    caplog.set_level(logging.INFO, logger="target_service.memory_link")
    link, _ = make_link(1, PairTable(vocab_size=100))  # port 1: nothing listens
    try:
        wait_until(lambda: any(level == logging.WARNING for level, _ in _link_lines(caplog)))
        wait_until(lambda: link.status().reconnects >= 3)
    finally:
        link.stop()
    warnings = [m for level, m in _link_lines(caplog) if level == logging.WARNING]
    assert len(warnings) == 1 and "not in use" in warnings[0], warnings


def test_a_writer_token_for_other_namespaces_is_an_error_naming_the_refusal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A token confined to other namespaces: the target said "unreachable" at WARNING and the PERMISSION_DENIED that
    said why was at DEBUG (found by probing); the refusal is an ERROR with its details now."""
    path = tmp_path / "writers"
    path.write_text(f"pair-a {TOKEN} pair/a+*\n")
    config = MemoryConfig(port=0, db_path=tmp_path / "m.db", writer_tokens=read_writer_tokens(path),
                          writer_scopes=read_writer_scopes(path), flush_interval_s=FLUSH_S)  # fmt: skip
    server, port, store = create_server(config)
    server.start()
    caplog.set_level(logging.INFO, logger="target_service.memory_link")
    table = PairTable(vocab_size=100)
    link, _ = make_link(port, table)  # namespace "ns": not the token's
    try:
        table.add_local(torch.tensor([1]), torch.tensor([2]))
        wait_until(lambda: link.status().flush_failures >= 3)  # the write resent every sync interval
    finally:
        link.stop()
        server.stop(None)
        store.close()
    errors = [m for level, m in _link_lines(caplog) if level == logging.ERROR]
    assert len(errors) == 1 and "PERMISSION_DENIED" in errors[0], errors  # once, not an ERROR a resend (review)


def test_the_health_is_published_before_connected_turns() -> None:
    """`connected` turned before the health said so: a caller that saw the outage found the health still SERVING
    (the outage test above failed once in six full runs)."""
    link = MemoryLink("127.0.0.1:1", "ns", PairTable(vocab_size=100), writer_token=TOKEN, writer_id="t1")  # not started
    seen: list[tuple[bool, bool]] = []  # (published, `connected` while it was published)
    link._on_status = lambda ok: seen.append((ok, link.connected))
    link._watch_ok = True
    link._update_connected()
    link._watch_ok = False
    link._update_connected(failed=True)
    assert seen == [(True, False), (False, True)]  # each state published while `connected` still held the previous

"""Caps, eviction order and decay of the correction memory, and the watch hub (see store.py's doc)."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest

from calispec_core.errors import InvalidArgument, PermissionDenied, ResourceExhausted, Unauthenticated
from memory_service import store as store_module
from memory_service.auth import WriterGate
from memory_service.config import MemoryConfig
from memory_service.store import CorrectionStore, TableLimits
from memory_service.watch import Delta, StreamReaper, UpdateKind, WatchHub, watch
from tests.helpers import wait_until


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def table(store: CorrectionStore, ns: str = "ns") -> dict[tuple[int, int], int]:
    return {(d, t): c for d, t, c in store.snapshot(ns)[0]}


def test_per_draft_cap_keeps_highest_counts_then_most_recent(tmp_path: Path) -> None:
    with CorrectionStore(tmp_path / "m.db", flush_interval_s=0, limits=TableLimits(100, 2)) as store:
        store.record("ns", [(1, 10, 5), (1, 11, 2)], durable=True)  # version 1
        store.record("ns", [(1, 12, 2)], durable=True)  # version 2: ties with (1, 11) on count, newer
        assert table(store) == {(1, 10): 5, (1, 12): 2}  # (1, 11) was updated longest ago
        store.record("ns", [(1, 13, 1), (2, 20, 1)], durable=True)  # a new count-1 pair loses at once
        assert table(store) == {(1, 10): 5, (1, 12): 2, (2, 20): 1}


def test_a_drafts_eviction_reads_that_drafts_rows_only(tmp_path: Path) -> None:
    """SQLite read a draft's rows through the rank index (ordered by count), i.e. every row of the namespace: 30 ms a
    draft at 65k pairs, a write to 1,000 full drafts took 22 s and held every other commit behind it (probed)."""
    with CorrectionStore(tmp_path / "m.db", flush_interval_s=0) as store:
        store.record("ns", [(1, 10, 5)], durable=True)
        query = store_module._EVICT_DRAFT.replace("RETURNING draft_token_id, target_token_id", "")
        with store._transaction(write=False) as db:
            plan = [row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {query}", ("ns", 1, 64)).fetchall()]
    assert any("(namespace=? AND draft_token_id=?)" in step for step in plan), plan


def test_global_cap_evicts_lowest_rank_and_reports_removals(tmp_path: Path) -> None:
    hub = WatchHub()
    with CorrectionStore(tmp_path / "m.db", flush_interval_s=0, limits=TableLimits(3, 10), hub=hub) as store:
        store.record("ns", [(1, 11, 4), (2, 12, 1), (3, 13, 1)], durable=True)  # version 1
        store.record("ns", [(4, 14, 2)], durable=True)  # version 2: 4 pairs > 3
        assert table(store) == {(1, 11): 4, (4, 14): 2, (2, 12): 1}  # tie at count 1 and version: larger ids go
        delta = hub.since("ns", 1, timeout_s=0)
        assert delta == [Delta("ns", 2, ((3, 13, 0), (4, 14, 2)))]  # count 0 = removed
        assert store.stats("ns") == (8, 3, 2)  # total_events counts every event ever recorded


def test_decay_halves_every_half_life_and_drops_zeros(tmp_path: Path) -> None:
    clock = Clock()
    limits = TableLimits(half_life_s=60)
    with CorrectionStore(tmp_path / "m.db", flush_interval_s=0, limits=limits, clock=clock) as store:
        store.record("ns", [(1, 11, 9), (2, 12, 1)], durable=True)
        clock.now += 59
        store.flush()
        assert table(store) == {(1, 11): 9, (2, 12): 1}  # not a whole half-life yet
        clock.now += 1
        assert store.flush()  # a decay step alone is a write: a new version for every namespace
        assert table(store) == {(1, 11): 4}
        clock.now += 120  # two half-lives at once (e.g. downtime)
        store.record("ns", [(3, 13, 5)], durable=True)  # decay applies first, new events are not halved
        assert table(store) == {(1, 11): 1, (3, 13): 5}
        assert store.snapshot("ns")[1] == 3


def test_decay_clock_survives_restart(tmp_path: Path) -> None:
    clock = Clock()
    limits = TableLimits(half_life_s=60)
    with CorrectionStore(tmp_path / "m.db", flush_interval_s=0, limits=limits, clock=clock) as store:
        store.record("ns", [(1, 11, 8)], durable=True)
    clock.now += 61
    with CorrectionStore(tmp_path / "m.db", flush_interval_s=0, limits=limits, clock=clock) as store:
        store.flush()
        assert table(store) == {(1, 11): 4}


@pytest.mark.parametrize(("kwargs", "message"), [({"max_pairs": 0}, "max_pairs"), ({"half_life_s": -1}, "half")])
def test_bad_limits_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        TableLimits(**kwargs)  # type: ignore[arg-type]


def test_watch_resumes_from_history_or_falls_back_to_a_snapshot() -> None:
    hub = WatchHub(history=2)
    hub.publish([Delta("ns", v, ((1, 1, v),)) for v in (1, 2, 3)])
    snapshots = []

    def read_snapshot() -> tuple[list[tuple[int, int, int]], int]:
        snapshots.append(1)
        return [(1, 1, 3)], 3

    def take(resume: int | None, n: int) -> list[tuple[UpdateKind, int]]:
        active = iter([True] * n + [False])
        updates = watch("ns", resume, hub, read_snapshot, lambda: 3, lambda: next(active), heartbeat_s=0.01)
        return [(u.kind, u.version) for u in updates]

    assert take(2, 1) == [(UpdateKind.DELTA, 3)]  # history holds version 3: exact resume
    assert take(0, 1)[0] == (UpdateKind.SNAPSHOT, 3)  # versions 1-2 fell out of the history
    assert take(7, 1)[0] == (UpdateKind.SNAPSHOT, 3)  # watcher is ahead: the service lost writes
    assert take(3, 1) == [(UpdateKind.HEARTBEAT, 3)]
    assert len(snapshots) == 2


def test_a_watch_stream_ends_at_its_age_limit_whoever_reads_it() -> None:
    """A client that stopped reading without closing its connection (SIGSTOP, a node gone) kept its Watch slot for
    good, its heartbeats buffered (found by probing): the stream now ends at `ends_at`, and a resume continues it."""
    hub = WatchHub()
    hub.publish([Delta("ns", 1, ((1, 1, 1),))])
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0  # each look at the clock, a second later
        return now[0]

    updates = watch("ns", None, hub, lambda: ([(1, 1, 1)], 1), lambda: 1, lambda: True, 0.001, ends_at=10.0,
                    clock=clock)  # fmt: skip
    kinds = [u.kind for u in itertools.islice(updates, 100)]
    assert kinds[0] == UpdateKind.SNAPSHOT and 1 < len(kinds) < 10  # heartbeats, then the end
    assert set(kinds[1:]) == {UpdateKind.HEARTBEAT}
    with pytest.raises(ValueError, match="watch_max_age_s"):
        MemoryConfig(watch_max_age_s=0)


def test_the_reaper_survives_a_stream_that_never_ends_and_a_cancel_that_fails() -> None:
    """`--watch-max-age 1e300` (meaning "never") overflowed the reaper's wait and ended its thread, and any cancel
    that raised did too: reaping was off for good (found by the review)."""
    reaper = StreamReaper()
    reaper.schedule(time.monotonic() + 1e300, lambda: None)  # first: the thread waits on it
    cancelled = threading.Event()

    def failing() -> None:
        raise RuntimeError("the stream was gone")

    reaper.schedule(time.monotonic(), failing)
    reaper.schedule(time.monotonic(), cancelled.set)
    wait_until(cancelled.is_set)


def test_the_watch_history_holds_at_most_its_pairs_whatever_the_namespaces() -> None:
    """Bounded by count alone (1,024 deltas a namespace), a service fed writes of 20,000 new pairs grew 4.7 MB a write
    with no watcher at all (found by probing); keeping each namespace's newest delta grew it by a delta per namespace
    (probing the fix: 4 M pairs held for a bound of 1 M). The oldest deltas of any namespace go first; a watcher
    behind a delta that is gone gets a snapshot (None), one at the latest version a heartbeat."""
    hub = WatchHub(history_pairs=10)
    pairs = tuple((d, 1, 1) for d in range(4))
    hub.publish([Delta("a", 1, pairs), Delta("b", 1, pairs)])
    hub.publish([Delta("a", 2, pairs)])  # 12 pairs: a's version 1 goes, the oldest
    assert not hub.covers("a", 0, 2) and hub.covers("a", 1, 2) and hub.covers("b", 0, 1)
    hub.publish([Delta("b", 2, pairs[:1])])  # 9
    assert hub.covers("b", 0, 2)
    hub.publish([Delta("c", 1, tuple((d, 2, 1) for d in range(30)))])  # over the budget alone: everything goes
    assert hub.since("c", 0, 0) is None and hub.since("a", 1, 0) is None  # behind: snapshots
    assert hub.since("a", 2, 0) == [] and not hub.covers("b", 1, 2)  # at the latest: a heartbeat
    for i in range(200):
        hub.publish([Delta(f"ns-{i}", 1, pairs)])
    assert hub._pairs <= 10 and len(hub._deltas) <= 2  # namespaces written once are not held


def test_the_watch_historys_bookkeeping_stays_bounded_by_what_it_keeps() -> None:
    hub = WatchHub(history=2)
    for version in range(1, 1001):
        hub.publish([Delta("a", version, ((1, 1, version),))])
    assert [d.version for d in hub.since("a", 998, 0) or []] == [999, 1000] and len(hub._order) <= 2 * 2 + 64


def test_writer_gate_token_and_rate_limit() -> None:
    clock = Clock(0.0)
    tokens = {"replica-a": "token-of-replica-a-0123", "replica-b": "token-of-replica-b-0123"}
    gate = WriterGate(tokens, events_per_s=10, burst_events=20, clock=clock)
    with pytest.raises(Unauthenticated):
        gate.admit(None, 1, "ns")
    with pytest.raises(Unauthenticated):
        gate.admit("wrong", 1, "ns")
    assert gate.admit("token-of-replica-a-0123", 20, "ns", peer="ipv4:10.0.0.1:5000") == "replica-a"
    with pytest.raises(ResourceExhausted, match="rate limit"):  # another connection: still replica-a
        gate.admit("token-of-replica-a-0123", 1, "ns", peer="ipv4:10.0.0.1:5001")
    assert gate.admit("token-of-replica-b-0123", 5, "ns") == "replica-b"  # limits are per identity
    clock.now += 1.0  # refills 10 events
    gate.admit("token-of-replica-a-0123", 10, "ns")


def test_a_rate_refusal_says_when_the_bucket_holds_the_write() -> None:
    """It said "retry later" only: a client could not tell a refusal worth retrying (an import, a seed) from one
    that never succeeds; the service now sends when (grpc-retry-pushback-ms)."""
    clock = Clock(0.0)
    gate = WriterGate({"a": "token-of-replica-a-0123"}, events_per_s=10, burst_events=20, clock=clock)
    gate.admit("token-of-replica-a-0123", 16, "ns")
    with pytest.raises(ResourceExhausted) as info:
        gate.admit("token-of-replica-a-0123", 10, "ns")  # 4 left: 6 more take 0.6 s
    assert info.value.retry_after_s == pytest.approx(0.6)
    clock.now += 0.6
    gate.admit("token-of-replica-a-0123", 10, "ns")


def test_writer_identity_comes_from_what_the_caller_proved() -> None:
    gate = WriterGate("one-shared-token-0123456789", events_per_s=10)
    assert gate.identify("one-shared-token-0123456789") == "writer"
    assert gate.identify("one-shared-token-0123456789", certificate_name="target-3") == "target-3/writer"
    open_gate = WriterGate(None, events_per_s=10)  # --allow-unauthenticated-writes
    assert open_gate.identify(None, peer="ipv4:10.0.0.7:52114") == "anonymous@ipv4:10.0.0.7"
    assert open_gate.identify(None, peer="ipv6:[::1]:52114") == "anonymous@ipv6:[::1]"
    assert open_gate.identify(None, certificate_name="target-3", peer="ipv4:10.0.0.7:1") == "target-3"


def test_writer_tokens_file_formats(tmp_path) -> None:
    from calispec_core.credentials import read_writer_scopes, read_writer_tokens
    from calispec_core.errors import FailedPrecondition

    one = tmp_path / "one"
    one.write_text("a-single-shared-token-0123\n")
    assert read_writer_tokens(one) == (("writer", "a-single-shared-token-0123"),)
    many = tmp_path / "many"
    many.write_text("# verifiers\ntarget-0 token-of-target-0-0123\n\ntarget-1 token-of-target-1-0123\n")
    assert read_writer_tokens(many) == (
        ("target-0", "token-of-target-0-0123"),
        ("target-1", "token-of-target-1-0123"),
    )
    assert read_writer_scopes(many) == ()  # no line names namespaces: each writes every one
    scoped = tmp_path / "scoped"
    scoped.write_text("target-0 token-of-target-0-0123 pair/a+* pair/c\ntarget-1 token-of-target-1-0123\n")
    assert [identity for identity, _ in read_writer_tokens(scoped)] == ["target-0", "target-1"]
    assert read_writer_scopes(scoped) == (("target-0", ("pair/a+*", "pair/c")),)
    bad_files = ["short", "a b c", "t0 same-token-0123456789\nt1 same-token-0123456789", "x y-too-short"]
    bad_files += [
        "target-0 token-of-target-0-0123 # rotated",  # a trailing comment: "#" and "rotated" were scopes
        "a-single-shared-token-0123 pair/draft-537d3c1b+*",  # the secret as identity, the pattern as token
        "target-0 token-of-target-0-0123 pair/a\\b",  # not a namespace character
    ]
    for bad in bad_files:
        path = tmp_path / "bad"
        path.write_text(bad)
        with pytest.raises(FailedPrecondition):
            read_writer_tokens(path)


def test_a_scoped_writer_is_refused_outside_its_namespaces_and_identified_inside() -> None:
    tokens = {"pair-a": "token-of-pair-a-0123456", "any": "token-of-any-writer-0123"}
    gate = WriterGate(tokens, events_per_s=10, scopes={"pair-a": ("pair/a+*",)})
    assert gate.identify("token-of-pair-a-0123456", certificate_name="target", namespace="pair/a+t") == "target/pair-a"
    assert gate.identify("token-of-pair-a-0123456") == "pair-a"  # a Watch writes no namespace
    with pytest.raises(PermissionDenied, match="pair/a"):
        gate.identify("token-of-pair-a-0123456", namespace="pair/b+t")
    assert gate.identify("token-of-any-writer-0123", namespace="pair/b+t") == "any"
    with pytest.raises(Unauthenticated):  # a stranger learns nothing of the scopes
        gate.identify("not-a-token-0123456789", namespace="pair/a+t")


def test_the_memory_service_takes_its_writers_scopes_from_the_token_file(tmp_path: Path) -> None:
    from memory_service.__main__ import parse_args

    writers = tmp_path / "writers"
    writers.write_text("coder-0 token-of-coder-0-0123456 pair/a+* pair/c\nany token-of-any-writer-0123\n")
    config, _ = parse_args(["--writer-token-file", str(writers), "--db", str(tmp_path / "m.db")])
    assert [identity for identity, _ in config.writer_tokens] == ["coder-0", "any"]
    assert config.writer_scopes == (("coder-0", ("pair/a+*", "pair/c")),)


def test_scopes_are_tuples_of_patterns_never_one_string() -> None:
    """A string is a sequence of one-letter patterns, and its `*` would let the writer write anywhere."""
    with pytest.raises(TypeError):
        WriterGate({"a": "token-of-writer-a-0123"}, events_per_s=10, scopes={"a": "pair/*"})  # type: ignore[dict-item]


def test_a_write_larger_than_the_burst_says_it_is_never_admitted() -> None:
    """It said "retry later", and every retry (an import over 1 M events) was refused the same way."""
    gate = WriterGate("a-writer-token-0123456789", events_per_s=10, burst_events=20)
    with pytest.raises(ResourceExhausted, match=r"never admitted.*--writer-burst"):
        gate.admit("a-writer-token-0123456789", 21, "ns")
    assert gate.admit("a-writer-token-0123456789", 20, "ns") == "writer"  # the refusal took nothing

"""CorrectionStore: counts, versions, validation that changes nothing, concurrency, persistence.

Most tests use a store without a flusher thread and durable records (each commits at once);
the group-commit path itself is covered by the concurrency, crash and watch tests.
"""

from __future__ import annotations

import logging
import random
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlite_utils
from prometheus_client import generate_latest

from calispec_core.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, Unavailable
from calispec_core.metrics import new_registry
from memory_service import store as store_module
from memory_service import write_ids
from memory_service.metrics import MemoryMetrics
from memory_service.store import MAX_EVENTS_PER_RECORD, MAX_TOTAL_EVENTS, CorrectionStore


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "memory.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[CorrectionStore]:
    with CorrectionStore(db_path, flush_interval_s=0) as s:
        yield s


def record(store: CorrectionStore, namespace: str, events: list[tuple[int, int, int]]) -> tuple[int, int]:
    """Record and commit at once (no flusher: the durable wait flushes inline)."""
    return store.record(namespace, events, durable=True)


def raw_counts(db_path: Path) -> dict[tuple[str, int, int], int]:
    """Everything in pair_counts, read with a separate sqlite-utils connection (not the store's)."""
    with sqlite_utils.Database(db_path) as db:
        return {(r["namespace"], r["draft_token_id"], r["target_token_id"]): r["count"] for r in db["pair_counts"].rows}


def raw_versions(db_path: Path) -> dict[str, tuple[int, int]]:
    with sqlite_utils.Database(db_path) as db:
        return {r["namespace"]: (r["version"], r["total_events"]) for r in db["namespace_versions"].rows}


# -- correctness ----------------------------------------------------------------------------------


def test_record_returns_sum_and_increments_version(store: CorrectionStore) -> None:
    assert record(store, "ns", [(1, 2, 3), (4, 5, 1)]) == (4, 1)
    assert record(store, "ns", [(1, 2, 2)]) == (2, 2)
    assert store.stats("ns") == (6, 2, 2)


def test_repeated_pairs_in_one_batch_add_up(store: CorrectionStore, db_path: Path) -> None:
    record(store, "ns", [(7, 8, 1), (7, 8, 2), (7, 8, 3)])
    assert raw_counts(db_path) == {("ns", 7, 8): 6}
    assert store.stats("ns") == (6, 1, 1)


def test_pairs_ordered_by_count_desc_with_min_count_and_max_pairs(store: CorrectionStore) -> None:
    record(store, "ns", [(1, 11, 5), (2, 12, 9), (3, 13, 1), (4, 14, 5), (5, 15, 7)])
    pairs, version = store.pairs("ns", min_count=0, max_pairs=100)
    # Equal counts are ordered by ids, so snapshots are deterministic.
    assert pairs == [(2, 12, 9), (5, 15, 7), (1, 11, 5), (4, 14, 5), (3, 13, 1)]
    assert version == 1
    assert store.pairs("ns", min_count=5, max_pairs=100)[0] == [(2, 12, 9), (5, 15, 7), (1, 11, 5), (4, 14, 5)]
    assert store.pairs("ns", min_count=6, max_pairs=100)[0] == [(2, 12, 9), (5, 15, 7)]
    assert store.pairs("ns", min_count=0, max_pairs=2)[0] == [(2, 12, 9), (5, 15, 7)]
    assert store.pairs("ns", min_count=10, max_pairs=100) == ([], 1)
    assert store.pairs("ns", min_count=2**64 - 1, max_pairs=100) == ([], 1)  # uint64 max is clamped


def test_namespaces_are_independent(store: CorrectionStore) -> None:
    record(store, "a", [(1, 2, 3)])
    record(store, "a", [(1, 2, 3)])
    record(store, "b/task:1", [(1, 2, 10), (3, 4, 1)])
    assert store.stats("a") == (6, 1, 2)
    assert store.stats("b/task:1") == (11, 2, 1)
    assert store.pairs("a", 0, 10) == ([(1, 2, 6)], 2)


def test_unknown_namespace_is_empty_at_version_zero(store: CorrectionStore) -> None:
    assert store.stats("never-written") == (0, 0, 0)
    assert store.pairs("never-written", 0, 10) == ([], 0)


def test_empty_batch_writes_nothing(store: CorrectionStore, db_path: Path) -> None:
    record(store, "ns", [(1, 2, 3)])
    assert record(store, "ns", []) == (0, 1)
    assert record(store, "other", []) == (0, 0)
    assert raw_versions(db_path) == {"ns": (1, 3)}


def test_database_is_in_wal_mode(store: CorrectionStore, db_path: Path) -> None:
    with sqlite_utils.Database(db_path) as db:
        assert db.journal_mode == "wal"


def test_counts_persist_across_close_and_reopen(db_path: Path) -> None:
    with CorrectionStore(db_path) as first:
        record(first, "ns", [(1, 2, 3), (4, 5, 6)])
        record(first, "ns", [(1, 2, 1)])
    with CorrectionStore(db_path) as second:
        assert second.stats("ns") == (10, 2, 2)
        assert second.pairs("ns", 0, 10) == ([(4, 5, 6), (1, 2, 4)], 2)
        assert record(second, "ns", [(4, 5, 1)]) == (1, 3)  # versions continue, not restart


def test_closed_store_raises_unavailable_and_close_is_idempotent(store: CorrectionStore) -> None:
    store.close()
    store.close()
    with pytest.raises(Unavailable, match="closed"):
        record(store, "ns", [(1, 2, 3)])
    with pytest.raises(Unavailable):
        store.stats("ns")


# -- validation: a rejected request changes nothing -----------------------------------------------

BAD_RECORDS = [
    pytest.param("", [(1, 2, 3)], InvalidArgument, "namespace", id="empty-namespace"),
    pytest.param("x" * 129, [(1, 2, 3)], InvalidArgument, "namespace", id="long-namespace"),
    pytest.param("has space", [(1, 2, 3)], InvalidArgument, "namespace", id="bad-char"),
    pytest.param("ns\n", [(1, 2, 3)], InvalidArgument, "namespace", id="trailing-newline"),
    pytest.param("ns", [(1, 2, 3), (-1, 2, 3)], InvalidArgument, r"events\[1\]\.draft", id="neg-draft"),
    pytest.param("ns", [(1, -2, 3)], InvalidArgument, r"events\[0\]\.target", id="neg-target"),
    pytest.param("ns", [(2**32, 2, 3)], InvalidArgument, "draft_token_id", id="draft-over-uint32"),
    pytest.param("ns", [(1, 2, 3), (1, 2, 0)], InvalidArgument, r"events\[1\]\.count", id="zero-count"),
    pytest.param("ns", [(1, 2, -4)], InvalidArgument, "count", id="negative-count"),
    pytest.param("ns", [(1, 2, 2**40 + 1)], InvalidArgument, "count", id="huge-count"),
    pytest.param("ns", [(1, 2, True)], InvalidArgument, "count", id="bool-count"),
    # no rejection pairs a token with itself; such a pair only took a slot under the caps (wave 54's left-alone list)
    pytest.param("ns", [(1, 2, 3), (7, 7, 1)], InvalidArgument, r"events\[1\] pairs token 7", id="self-pair"),
    pytest.param("ns", [(1, 2, 1)] * (MAX_EVENTS_PER_RECORD + 1), ResourceExhausted, "too many", id="too-many"),
]


@pytest.mark.parametrize(("namespace", "events", "error", "message"), BAD_RECORDS)
def test_invalid_record_is_rejected_and_changes_nothing(
    store: CorrectionStore,
    db_path: Path,
    namespace: str,
    events: list[tuple[int, int, int]],
    error: type[Exception],
    message: str,
) -> None:
    record(store, "ns", [(1, 2, 3)])
    before = (raw_counts(db_path), raw_versions(db_path))
    with pytest.raises(error, match=message):
        record(store, namespace, events)
    assert (raw_counts(db_path), raw_versions(db_path)) == before


def test_largest_valid_values_are_accepted(store: CorrectionStore) -> None:
    assert record(store, "n" * 128, [(2**32 - 1, 0, 2**40)]) == (2**40, 1)
    assert record(store, "ns", [(1, 2, 1)] * MAX_EVENTS_PER_RECORD) == (MAX_EVENTS_PER_RECORD, 1)


@pytest.mark.parametrize(
    ("min_count", "max_pairs", "message"),
    [(-1, 10, "min_count"), (0, 0, "max_pairs"), (0, -5, "max_pairs"), (0, 1_000_001, "max_pairs")],
)
def test_invalid_pairs_query(store: CorrectionStore, min_count: int, max_pairs: int, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        store.pairs("ns", min_count, max_pairs)


def test_namespace_total_overflow_is_refused_and_changes_nothing(db_path: Path) -> None:
    with CorrectionStore(db_path, flush_interval_s=0) as first:
        record(first, "ns", [(1, 2, 3)])
    with sqlite_utils.Database(db_path) as db:  # a namespace one batch away from int64 overflow
        db.execute("UPDATE namespace_versions SET total_events = ?", (MAX_TOTAL_EVENTS - 3,))
    store = CorrectionStore(db_path, flush_interval_s=0)  # totals are loaded at open
    before = (raw_counts(db_path), raw_versions(db_path))
    with pytest.raises(ResourceExhausted, match="overflow"):
        record(store, "ns", [(1, 2, 2), (5, 6, 2)])
    with pytest.raises(ResourceExhausted, match="overflow"):  # one declaring a vocabulary declares none
        store.record("ns", [(1, 2, 4)], durable=True, vocab_size=100)
    assert (raw_counts(db_path), raw_versions(db_path)) == before
    assert store.vocab_limit("ns") is None
    assert record(store, "ns", [(1, 2, 3)])[1] == 2  # exactly up to the cap still fits
    store.close()


def test_a_vocabulary_the_wire_cannot_carry_is_refused(store: CorrectionStore) -> None:
    """RecordEvents carries vocab_size as a uint32: 2**32 was in range here (and in the export reader, where it
    crashed `memory import`; wave 50)."""
    with pytest.raises(InvalidArgument, match="vocab_size out of range"):
        store.vocab_limit("ns", 2**32)
    assert store.vocab_limit("ns", 2**32 - 1) == 2**32 - 1


def test_failure_after_partial_write_rolls_back_the_whole_batch(store: CorrectionStore, db_path: Path) -> None:
    record(store, "ns", [(1, 2, 3)])
    # Make the version bump (the batch's last statement) fail after the pair upserts ran.
    with sqlite_utils.Database(db_path) as db:
        db.execute(
            "CREATE TRIGGER fail_bump BEFORE UPDATE ON namespace_versions "
            "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
        )
    before = raw_counts(db_path)
    with pytest.raises(sqlite3.IntegrityError, match="injected failure"):
        record(store, "ns", [(1, 2, 5), (9, 10, 1)])
    assert raw_counts(db_path) == before
    assert store.stats("ns") == (3, 1, 1)


# -- concurrency ----------------------------------------------------------------------------------

THREADS = 8
BATCHES_PER_THREAD = 200


def _batches(seed: int) -> list[list[tuple[int, int, int]]]:
    """Random batches over a small pair space, so threads collide on the same rows."""
    rng = random.Random(seed)
    return [
        [(rng.randrange(6), 6 + rng.randrange(6), rng.randint(1, 9)) for _ in range(rng.randint(1, 8))]
        for _ in range(BATCHES_PER_THREAD)
    ]


def test_concurrent_records_give_exact_totals(db_path: Path) -> None:
    """Group commit under contention: every accepted event is in SQLite once, versions are consistent."""
    work = [_batches(seed) for seed in range(THREADS)]
    expected: Counter[tuple[str, int, int]] = Counter()
    for batches in work:
        for batch in batches:
            for draft, target, count in batch:
                expected["ns", draft, target] += count
    start = threading.Barrier(THREADS)
    store = CorrectionStore(db_path, flush_interval_s=0.005)

    def run(batches: list[list[tuple[int, int, int]]]) -> list[int]:
        start.wait()
        versions = []
        for i, batch in enumerate(batches):
            versions.append(store.record("ns", batch)[1])
            if i % 50 == 49:  # flushes race the other writers for sure, not only when the timer fires
                store.flush()
        return versions

    with ThreadPoolExecutor(THREADS) as pool:
        versions = [v for result in pool.map(run, work) for v in result]
    store.close()  # commits the last open batch

    assert raw_counts(db_path) == dict(expected)
    final_version, total = raw_versions(db_path)["ns"]
    assert total == sum(expected.values())
    assert max(versions) == final_version  # the last promised version is the last committed one
    assert final_version > 1  # flushes ran during the storm, not one at close
    with CorrectionStore(db_path, flush_interval_s=0) as reopened:
        assert reopened.stats("ns") == (total, len(expected), final_version)


def test_snapshot_at_version_v_holds_exactly_the_records_promised_v(db_path: Path) -> None:
    """record() returns the version whose snapshot contains it; check that against concurrent reads."""
    writes = 300
    done = threading.Event()
    promised: list[int] = []
    reads: list[tuple[int, int]] = []
    store = CorrectionStore(db_path, flush_interval_s=0.002)

    seen = threading.Condition()

    def write() -> None:
        try:
            for i in range(writes):
                promised.append(store.record("ns", [(1, 2, 1)])[1])
                if i % 30 == 29:  # commit, then let the reader see this version before writing on
                    store.flush()
                    with seen:
                        assert seen.wait_for(lambda: reads and reads[-1][1] >= promised[-1], timeout=30)
        finally:
            done.set()

    def read() -> None:
        while not done.is_set():
            pairs, version = store.pairs("ns", 0, 10)
            with seen:
                reads.append((sum(c for _, _, c in pairs), version))
                seen.notify_all()

    with ThreadPoolExecutor(2) as pool:
        reader = pool.submit(read)
        pool.submit(write).result()
        reader.result()
    store.close()
    for total, version in reads:
        assert total == sum(v <= version for v in promised), (total, version)
    assert len({v for _, v in reads}) > 1


def test_a_namespace_vocabulary_survives_restarts_and_bounds_imports(db_path: Path) -> None:
    with CorrectionStore(db_path, flush_interval_s=0) as store:
        store.declare_vocab("ns", 10)
        store.declare_vocab("ns", 0)  # declaring nothing is always fine
    with CorrectionStore(db_path, flush_interval_s=0) as store:
        with pytest.raises(InvalidArgument):  # an import (durable record) of another vocabulary's ids
            store.record("ns", [(1, 2, 1), (3, 10, 1)], durable=True)
        with pytest.raises(FailedPrecondition):
            store.declare_vocab("ns", 11)
        assert store.record("other", [(3, 10, 1)]) == (1, 1)  # other namespaces are not affected
        assert store.stats("ns") == (0, 0, 0) and store.table_stats("ns").vocab_size == 10


def test_a_conditional_write_sees_events_still_buffered_and_declares_nothing(store: CorrectionStore) -> None:
    """The emptiness a seeder relies on includes the open batch: a write acknowledged but not yet committed
    makes the namespace written; a refused seed neither counts nor fixes the namespace's vocabulary."""
    store.record("ns", [(1, 2, 3)])  # buffered, not flushed
    with pytest.raises(FailedPrecondition, match="already holds counts"):
        store.record("ns", [(5, 6, 7)], vocab_size=50, only_if_empty=True)
    store.flush()
    assert store.snapshot("ns")[0] == [(1, 2, 3)]
    assert store.vocab_limit("ns") is None  # 50 was not declared: a writer with another vocabulary may still come
    assert store.record("fresh", [(5, 6, 7)], only_if_empty=True, durable=True)[0] == 7


# -- idempotent writes: a RecordEvents retried with its write_id (its reply was lost) counts once --------
# Before write ids a verifier whose write timed out after the store accepted it sent the events again: counted twice.

WRITE_EVENTS = [(1, 2, 3), (4, 5, 1)]


def snapshot_counts(store: CorrectionStore, namespace: str = "ns") -> dict[tuple[int, int], int]:
    pairs, _ = store.snapshot(namespace)
    return {(d, t): c for d, t, c in pairs}


def test_a_retry_with_the_same_write_id_counts_once_and_gets_the_first_reply(store: CorrectionStore) -> None:
    first = store.record("ns", WRITE_EVENTS, write_id="w-1")  # buffered, not committed yet
    again = store.record("ns", list(reversed(WRITE_EVENTS)), write_id="w-1")  # the same events, another order
    store.flush()
    after_commit = store.record("ns", WRITE_EVENTS, durable=True, write_id="w-1")
    assert first == again == after_commit == (4, 1)
    assert snapshot_counts(store) == {(1, 2): 3, (4, 5): 1}
    assert store.stats("ns")[2] == 1  # one committed write: the version did not move


def test_writes_without_an_id_or_with_new_ids_all_count(store: CorrectionStore) -> None:
    store.record("ns", WRITE_EVENTS, durable=True)
    store.record("ns", WRITE_EVENTS, durable=True)
    store.record("ns", WRITE_EVENTS, durable=True, write_id="a")
    store.record("ns", WRITE_EVENTS, durable=True, write_id="b")
    store.record("other", WRITE_EVENTS, durable=True, write_id="a")  # ids are per namespace
    assert snapshot_counts(store) == {(1, 2): 12, (4, 5): 4}
    assert snapshot_counts(store, "other") == {(1, 2): 3, (4, 5): 1}


def test_the_ids_survive_a_restart(db_path: Path) -> None:
    with CorrectionStore(db_path, flush_interval_s=0) as store:
        assert store.record("ns", WRITE_EVENTS, durable=True, write_id="before-restart") == (4, 1)
    with CorrectionStore(db_path, flush_interval_s=0) as store:
        assert store.record("ns", WRITE_EVENTS, durable=True, write_id="before-restart") == (4, 1)
        assert snapshot_counts(store) == {(1, 2): 3, (4, 5): 1}


def test_an_id_reused_for_other_events_is_refused_and_changes_nothing(store: CorrectionStore) -> None:
    store.record("ns", WRITE_EVENTS, durable=True, write_id="w")
    with pytest.raises(InvalidArgument, match="already used for other events"):
        store.record("ns", [(1, 2, 4)], durable=True, write_id="w")
    assert snapshot_counts(store) == {(1, 2): 3, (4, 5): 1}


@pytest.mark.parametrize("bad", ["x" * 65, "has space", "slash/", "ü", 7])
def test_a_malformed_write_id_is_refused_before_anything_is_written(store: CorrectionStore, bad: object) -> None:
    with pytest.raises(InvalidArgument, match="write_id"):
        store.record("ns", WRITE_EVENTS, durable=True, write_id=bad)  # type: ignore[arg-type]
    assert snapshot_counts(store) == {}


def test_a_retried_seed_succeeds_instead_of_finding_its_own_snapshot_counts(store: CorrectionStore) -> None:
    """only_if_empty: the retry of the write that filled the namespace is that write, not a second seeder."""
    store.record("ns", WRITE_EVENTS, durable=True, only_if_empty=True, write_id="seed")
    assert store.record("ns", WRITE_EVENTS, durable=True, only_if_empty=True, write_id="seed") == (4, 1)
    with pytest.raises(FailedPrecondition):
        store.record("ns", WRITE_EVENTS, durable=True, only_if_empty=True, write_id="another-seeder")
    assert snapshot_counts(store) == {(1, 2): 3, (4, 5): 1}


def test_only_the_newest_ids_are_kept(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write_ids, "MAX_WRITE_IDS", 3)
    with CorrectionStore(db_path, flush_interval_s=0) as store:
        for i in range(5):
            store.record("ns", [(1, 2, 1)], durable=True, write_id=f"w{i}")
    with sqlite_utils.Database(db_path) as db:
        assert sorted(r["write_id"] for r in db["accepted_writes"].rows) == ["w2", "w3", "w4"]
    with CorrectionStore(db_path, flush_interval_s=0) as store:
        store.record("ns", [(1, 2, 1)], durable=True, write_id="w4")  # remembered: not counted
        store.record("ns", [(1, 2, 1)], durable=True, write_id="w0")  # forgotten: counted again
        assert snapshot_counts(store) == {(1, 2): 6}


def test_a_writer_waits_for_the_commit_before_queueing_more_than_its_share(
    store: CorrectionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Probed: one writer's five 100k-pair writes in 10 s (half its rate) queued ~35 s of flushing (a commit costs
    per pair), and another writer's 1-event durable write gave up after 30 s. A writer now has at most
    MAX_PENDING_PER_WRITER entries waiting for a commit; its next write is refused whole, the others' are not."""
    monkeypatch.setattr(store_module, "MAX_PENDING_PER_WRITER", 10)
    store.record("ns", [(d, 10, 1) for d in range(8)], writer="bulk")
    store.record("ns", [(d, 20, 1) for d in range(3)], writer="bulk")  # 8 waiting, under its share: 11 now
    with pytest.raises(ResourceExhausted, match="'bulk' has 11 entries waiting for the next commit, its share"):
        store.record("ns", [(20, 2, 1)], writer="bulk")
    store.record("ns", [(1, 3, 5)], writer="verifier")  # another writer's share
    store.record("ns", [], writer="bulk")  # an empty write (a check) adds nothing to commit
    store.flush()
    assert store.stats("ns")[0] == 8 + 3 + 5  # the refused write counted nothing
    store.record("ns", [(d, 40, 1) for d in range(11)], writer="bulk")  # nothing waiting: any legal write


def full_disk_error() -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError("database or disk is full")
    exc.sqlite_errorcode = sqlite3.SQLITE_FULL  # as SQLite sets it
    return exc


def test_while_commits_fail_writes_are_refused_not_acknowledged(
    store: CorrectionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a full disk every flush failed while writes were still acknowledged, with versions later given to other
    writes: 20,000 acknowledged events were lost to a restart (found by probing). Writes are refused until a commit
    succeeds; what was acknowledged before is committed then, with the versions it was given."""
    version = store.record("ns", [(1, 2, 3)])[1]
    write_namespace = store._write_namespace

    def disk_full(*args: object) -> object:
        raise full_disk_error()

    monkeypatch.setattr(store, "_write_namespace", disk_full)
    with pytest.raises(Unavailable, match="the correction memory's database: database or disk is full"):
        store.flush()
    with pytest.raises(
        Unavailable, match=r"cannot commit \(the correction memory's database: database or disk is full"
    ):
        store.record("ns", [(4, 5, 1)])
    assert store.failing is not None and store.commit_failures == 1
    registry = new_registry()
    MemoryMetrics(registry, store)
    exported = generate_latest(registry).decode()
    assert "calispec_memory_commit_failing 1.0" in exported and "calispec_memory_commit_failures_total 1.0" in exported
    monkeypatch.setattr(store, "_write_namespace", write_namespace)
    assert store.flush() and store.failing is None
    assert "calispec_memory_commit_failing 0.0" in generate_latest(registry).decode()
    assert store.snapshot("ns") == ([(1, 2, 3)], version)
    store.record("ns", [(4, 5, 1)], durable=True)


def test_a_database_that_cannot_write_is_unavailable_not_a_bug(
    store: CorrectionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a full disk, a write declaring a new namespace's vocabulary (a verifier's first, `calibrate`'s check) was
    INTERNAL with a traceback, and the writer's rate charge kept (found by probing)."""
    assert store._db is not None
    execute = store._db.execute

    def full(sql: str, *args: object) -> object:
        if "namespace_vocab" in sql:
            raise full_disk_error()
        return execute(sql, *args)

    monkeypatch.setattr(store._db, "execute", full)
    with pytest.raises(Unavailable, match="database or disk is full"):
        store.record("fresh", [(1, 2, 3)], vocab_size=100)
    assert store.stats("fresh")[0] == 0


def test_sql_this_code_got_wrong_stays_a_bug(store: CorrectionStore) -> None:
    with pytest.raises(sqlite3.OperationalError), store._transaction(write=False) as db:
        db.execute("SELECT no_such_column FROM pair_counts")


def test_a_new_database_is_said_to_be_new(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A typo in --db made a fresh, empty memory (directories and all) without a word (found by probing)."""
    path = tmp_path / "typo" / "memory.db"
    with caplog.at_level(logging.INFO, logger="memory_service.store"), CorrectionStore(path, flush_interval_s=0):
        pass
    assert f"no memory database at {path}: a new one is made" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="memory_service.store"), CorrectionStore(path, flush_interval_s=0):
        pass
    assert "a new one is made" not in caplog.text  # the second time it is there

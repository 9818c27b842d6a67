"""The Online Correction Memory's storage: per-namespace counts of rejected (draft, target) pairs.

Domain code only (no gRPC): bad input raises `calispec_core.errors` types that the service's
error interceptor maps to a status.

Writes are *group-committed*. `record()` validates a request, adds it to an in-memory open
batch and returns at once; a flusher thread commits the open batch every `flush_interval_s`
in ONE SQLite transaction (WAL, synchronous=FULL: one fsync per flush, not per request).
Crash bound: a `kill -9` loses at most the events acknowledged since the last commit, i.e.
within the last flush interval plus the duration of the flush in progress. While flushes fail (a full disk), writes
are refused (UNAVAILABLE) rather than acknowledged: they were, and a crash then lost every one of them.
A request may ask for `durable=True` to wait for its commit (calibration and imports do). A clean shutdown
(`close()`) commits everything. Because each request lands in exactly one flush, a request
is all-or-nothing; additions under one lock make concurrent totals exact.

One store per file: the store holds an exclusive lock on `<db>.lock` while open, and a second one
(another service on the same file) is refused with DatabaseInUse naming the holder; see
`memory_service/db_lock.py` for what two would do to each other.

Versions: each namespace has a version that counts the committed flushes that changed it
(0 = never written). `record()` returns the version whose snapshot will contain the request
(assigned when the batch is taken, so it is known at once). Reads return the version from
the same transaction as the data. After each commit the store publishes, per namespace, the
pairs that changed (absolute counts; 0 = removed) to its `WatchHub`, which feeds Watch streams.

Bounds (`TableLimits`), applied in the same transaction as the write that overflowed them:
- rank of a pair = (count desc, version of its last update desc, draft id asc, target id asc);
- a draft token keeps at most `max_pairs_per_draft` targets, a namespace at most `max_pairs`
  pairs; the lowest-ranked pairs beyond a cap are deleted. So among equal counts the pair not
  updated for the longest goes first, and a brand-new pair loses against any pair counted more.
- decay (optional): every `half_life_s` of wall time every count is halved (integer division;
  pairs reaching 0 are deleted). Halving in whole steps keeps counts exact integers and the
  rule testable; missed steps (downtime) are applied together on the next flush. The time of
  the last step is stored in the database, so restarts do not reset the clock.
`total_events` stays the number of events ever recorded; `table_events` is what the table
holds now (after decay and eviction).

Vocabulary: a namespace holds the token ids of one model pair. The first writer or watcher
that declares a vocabulary size fixes it for the namespace (stored, survives restarts); from
then on a write with an id outside [0, vocab_size) is refused whole (INVALID_ARGUMENT) and a
client declaring another size is refused (FAILED_PRECONDITION). A namespace nobody declared
accepts any uint32 id, as before.

Fair commits: a flush costs per distinct pair (tens of µs each), far more than the writers' rate limit counts, so a
writer whose entries waiting for the next flush reach MAX_PENDING_PER_WRITER (its share) is refused (RESOURCE_EXHAUSTED,
retry after the flush; nothing changes) until that flush takes them: a batch holds less than a share plus one write of
each writer. So another writer's durable write waits for at most two batches, never for a backlog one fast writer
built (probed: five 100k-pair writes in 10 s pushed another writer's 1-event durable write past DURABLE_WAIT_S).

Idempotent writes: a request may carry a `write_id`; a retry with the same id (the first reply was
lost) counts nothing and gets the first reply again (`memory_service/write_ids.py`).
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import sqlite_utils

from calispec_core.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, Unavailable, require
from calispec_core.limits import MAX_STATS_TOP_PAIRS, NAMESPACE_PATTERN
from memory_service import write_ids
from memory_service.db_lock import DatabaseLock
from memory_service.stored_state import Bounds, check_stored_state
from memory_service.watch import Delta, WatchHub

log = logging.getLogger(__name__)

MAX_TOKEN_ID = 2**32 - 1  # ids travel as uint32 on the wire
MAX_VOCAB_SIZE = 2**32 - 1  # and so does a declared vocabulary's size
MAX_EVENT_COUNT = 2**40  # one event this large is already a client bug, not a real tally
MAX_EVENTS_PER_RECORD = 100_000
MAX_PENDING_PER_WRITER = MAX_EVENTS_PER_RECORD  # a writer's share: once its entries waiting reach it, it is refused
MAX_PAIRS_LIMIT = 1_000_000  # keeps a GetPairs reply well under the 64 MiB message cap
# SQLite integers are signed 64-bit; a namespace's total is capped there so no count can overflow.
MAX_TOTAL_EVENTS = 2**63 - 1
SCHEMA_VERSION = 2  # PRAGMA user_version; bump with a migration when the tables change
BUSY_TIMEOUT_S = 5.0  # only another process (an inspector, a backup) can hold the write lock
# SQLite's primary result codes of a database that cannot be written now (a full disk, another process's lock, the
# file's device or permissions): UNAVAILABLE, retried by clients; any other error is a bug
_UNAVAILABLE_ERRORS = frozenset(
    (sqlite3.SQLITE_FULL, sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY,
     sqlite3.SQLITE_CANTOPEN)
)  # fmt: skip
DURABLE_WAIT_S = 30.0  # a durable record gives up (UNAVAILABLE) if no flush commits in this time
TOP_SHARE_FRACTION = 0.2  # the paper: the top 20% of pairs cover ~69% of rejections

Event = tuple[int, int, int]  # (draft_token_id, target_token_id, count)
Pair = tuple[int, int, int]  # (draft_token_id, target_token_id, count)
Key = tuple[int, int]  # (draft_token_id, target_token_id)

_UPSERT_PAIR = """
INSERT INTO pair_counts (namespace, draft_token_id, target_token_id, "count", last_version) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (namespace, draft_token_id, target_token_id)
DO UPDATE SET "count" = "count" + excluded."count", last_version = excluded.last_version
"""
_CHUNK = 500  # ids per IN (...) list, under SQLite's bound-parameter limit
_SELECT_DRAFTS = """
SELECT draft_token_id, target_token_id, "count" FROM pair_counts WHERE namespace = ? AND draft_token_id IN ({marks})
"""
_OVER_CAP = """
SELECT draft_token_id FROM pair_counts WHERE namespace = ? AND draft_token_id IN ({marks})
GROUP BY draft_token_id HAVING COUNT(*) > ?
"""
_SET_VERSION = """
INSERT INTO namespace_versions (namespace, version, total_events) VALUES (?, ?, ?)
ON CONFLICT (namespace) DO UPDATE SET version = excluded.version, total_events = total_events + excluded.total_events
"""
_SELECT_VERSION = "SELECT version, total_events FROM namespace_versions WHERE namespace = ?"
# Ties are broken by ids so equal snapshots always list pairs in the same order.
_SELECT_PAIRS = """
SELECT draft_token_id, target_token_id, "count" FROM pair_counts
WHERE namespace = ? AND "count" >= ?
ORDER BY "count" DESC, draft_token_id, target_token_id
LIMIT ?
"""
_SELECT_COUNTS = 'SELECT "count" FROM pair_counts WHERE namespace = ? ORDER BY "count" DESC'
_COUNT_PAIRS = "SELECT COUNT(*) FROM pair_counts WHERE namespace = ?"
_DECAY = """
UPDATE pair_counts SET "count" = "count" >> ? WHERE namespace = ?
RETURNING draft_token_id, target_token_id, "count"
"""
_DROP_ZEROS = 'DELETE FROM pair_counts WHERE namespace = ? AND "count" <= 0'
# The eviction rank (see module doc): keep the first `cap`, delete the rest. `+"count"`: ordering by the rank index
# made SQLite read the draft's rows through it, i.e. every row of the namespace (30 ms a draft at 65k pairs, so a
# write to 1,000 full drafts took 22 s and held every commit behind it; found by probing); the key finds them.
_EVICT_DRAFT = """
DELETE FROM pair_counts WHERE rowid IN (
  SELECT rowid FROM pair_counts WHERE namespace = ? AND draft_token_id = ?
  ORDER BY +"count" DESC, last_version DESC, draft_token_id, target_token_id LIMIT -1 OFFSET ?)
RETURNING draft_token_id, target_token_id
"""
_EVICT_GLOBAL = """
DELETE FROM pair_counts WHERE rowid IN (
  SELECT rowid FROM pair_counts WHERE namespace = ?
  ORDER BY "count" ASC, last_version ASC, draft_token_id DESC, target_token_id DESC LIMIT ?)
RETURNING draft_token_id, target_token_id
"""
_VOCAB_SET = "INSERT INTO namespace_vocab (namespace, vocab_size) VALUES (?, ?) ON CONFLICT (namespace) DO NOTHING"
_LIST_NAMESPACES = """
SELECT v.namespace, COUNT(p.draft_token_id), COALESCE(SUM(p."count"), 0), v.total_events, v.version
FROM namespace_versions v LEFT JOIN pair_counts p ON p.namespace = v.namespace
GROUP BY v.namespace ORDER BY v.namespace
"""
_META_GET = "SELECT value FROM store_meta WHERE key = ?"
_META_SET = "INSERT INTO store_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
# What the store reads back, with the range it relies on, checked on open (stored_state.py): a table made without
# STRICT (by hand, by another program) may hold text or a float anywhere, and reads and flushes failed on it long
# after start-up (found by probing).
_TEXT: Bounds = None
_NON_NEGATIVE: Bounds = (0, MAX_TOTAL_EVENTS)
_STORED_COLUMNS: dict[str, dict[str, Bounds]] = {
    "pair_counts": {
        "namespace": _TEXT,
        "draft_token_id": (0, MAX_TOKEN_ID),
        "target_token_id": (0, MAX_TOKEN_ID),
        "count": (1, MAX_TOTAL_EVENTS),  # a pair counted 0 times is deleted
        "last_version": _NON_NEGATIVE,
    },
    "namespace_versions": {"namespace": _TEXT, "version": _NON_NEGATIVE, "total_events": _NON_NEGATIVE},
    "namespace_vocab": {"namespace": _TEXT, "vocab_size": (1, MAX_VOCAB_SIZE)},
    "store_meta": {"key": _TEXT},
    "accepted_writes": {
        "namespace": _TEXT,
        "write_id": _TEXT,
        "digest": _TEXT,
        "recorded": _NON_NEGATIVE,
        "version": _NON_NEGATIVE,
    },
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_namespace(namespace: object) -> str:
    require(isinstance(namespace, str), "namespace must be a string")
    assert isinstance(namespace, str)  # for the type checker; require() raised otherwise
    require(
        NAMESPACE_PATTERN.fullmatch(namespace) is not None,
        f"namespace must be 1-128 characters of [A-Za-z0-9._:/+-], got {namespace[:140]!r}",
    )
    return namespace


def validate_events(events: Sequence[Event], vocab_size: int | None = None) -> int:
    """Check a batch before anything is written; returns the sum of its counts.

    vocab_size: the namespace's vocabulary (ids must be below it); None: any uint32 id.
    """
    max_id = MAX_TOKEN_ID if vocab_size is None else vocab_size - 1
    if len(events) > MAX_EVENTS_PER_RECORD:
        raise ResourceExhausted(
            f"too many events in one request: {len(events)} > {MAX_EVENTS_PER_RECORD}; split the batch"
        )
    total = 0
    for i, (draft, target, count) in enumerate(events):
        for name, token in (("draft_token_id", draft), ("target_token_id", target)):
            require(
                _is_int(token) and 0 <= token <= max_id,
                f"events[{i}].{name} must be an integer in [0, {max_id}] (the namespace's vocabulary), got {token!r}",
            )
        require(draft != target, f"events[{i}] pairs token {draft} with itself: no rejection makes such a pair")
        require(
            _is_int(count) and 1 <= count <= MAX_EVENT_COUNT,
            f"events[{i}].count must be an integer in [1, 2**40], got {count!r}",
        )
        total += count
    return total


class AcceptedNotDurable(Unavailable):
    """A durable write whose events are buffered (they will be committed) but not yet on disk."""


@dataclass(frozen=True)
class TableLimits:
    """Caps per namespace and decay; see the module doc for the eviction rule."""

    max_pairs: int = 65_536  # = the verifiers' default snapshot size, so they always see the whole table
    max_pairs_per_draft: int = 64
    half_life_s: float = 0.0  # 0: no decay

    def __post_init__(self) -> None:
        if not 1 <= self.max_pairs <= MAX_PAIRS_LIMIT:
            raise InvalidArgument(f"max_pairs must be in [1, {MAX_PAIRS_LIMIT}], got {self.max_pairs}")
        if self.max_pairs_per_draft < 1:
            raise InvalidArgument(f"max_pairs_per_draft must be >= 1, got {self.max_pairs_per_draft}")
        if not self.half_life_s >= 0 or math.isinf(self.half_life_s):
            raise InvalidArgument(f"half_life_s must be a finite number >= 0, got {self.half_life_s}")


@dataclass(frozen=True)
class CountBucket:
    min_count: int  # inclusive
    max_count: int  # inclusive
    pairs: int
    events: int


@dataclass(frozen=True)
class TableStats:
    total_events: int  # ever recorded
    distinct_pairs: int  # in the table now
    version: int
    table_events: int  # sum of the counts in the table now
    top_pairs: list[Pair]
    top_share: float  # share of table_events held by the top 20% of pairs (0 for an empty table)
    histogram: list[CountBucket]  # power-of-two buckets: 1, 2-3, 4-7, ...
    db_bytes: int  # database file plus WAL: the whole store, all namespaces
    vocab_size: int = 0  # the namespace's declared vocabulary, 0: none declared


@dataclass(frozen=True)
class NamespaceInfo:
    namespace: str
    distinct_pairs: int  # in the table now
    table_events: int  # sum of the counts in the table now
    total_events: int  # ever recorded
    version: int


@dataclass
class _Batch:
    """Requests accepted since the last take; committed as one transaction."""

    events: dict[str, Counter[Key]] = field(default_factory=dict)
    totals: Counter[str] = field(default_factory=Counter)
    versions: dict[str, int] = field(default_factory=dict)  # set when taken
    decay_steps: int = 0
    decay_until: float = 0.0
    seq: int = 0
    writes: list[tuple[str, str, write_ids.AcceptedWrite]] = field(default_factory=list)  # with a write_id
    pending: Counter[str] = field(default_factory=Counter)  # entries accepted per writer (what the flush pays for)


class CorrectionStore:
    """Thread-safe, group-committed counts of rejected pairs, one SQLite file, versioned per namespace."""

    def __init__(
        self,
        db_path: Path | str,
        *,
        flush_interval_s: float = 0.5,
        limits: TableLimits | None = None,
        hub: WatchHub | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """flush_interval_s 0 means no flusher thread: callers flush (tests, tools)."""
        require(flush_interval_s >= 0, f"flush_interval_s must be >= 0, got {flush_interval_s}")
        self.db_path = Path(db_path)
        self.flush_interval_s = flush_interval_s
        self.limits = limits or TableLimits()
        self.hub = hub or WatchHub()
        self._clock = clock
        self._db_lock = threading.Lock()  # the connection
        self._flush_lock = threading.Lock()  # one flush at a time
        self._cond = threading.Condition()  # open batch, assigned versions, commit progress
        # Before the file is opened: a second store on it would diverge from this one (memory_service/db_lock.py).
        self.file_lock = _lock_database(self.db_path)
        self._db: sqlite_utils.Database | None = None
        try:
            self._db = _open_database(self.db_path, clock())
            self._versions, self._totals, self._last_decay = self._load_state()
            self._vocab = self._load_vocab()
            self._writes = write_ids.WriteLog(self._load_writes())
        except BaseException:
            self._let_go()  # a store that failed to open holds neither the file nor its lock
            raise
        self._vocab_lock = threading.Lock()  # declarations: check and store as one step
        self._committed = dict(self._versions)
        self._open = _Batch()
        self._taken: _Batch | None = None  # taken but not committed yet (retried after a failure)
        self._assigned_seq = 0
        self._committed_seq = 0
        self._closed = False
        self.committed_events = 0  # events this process committed (for metrics; not persisted)
        self._last_flush_s = 0.0  # how long the last commit took: when a writer over its share may retry
        self.commit_failures = 0  # flushes that failed (for metrics; not persisted)
        self._failing: str | None = None  # why the last flush failed; None once one succeeds
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if flush_interval_s > 0:
            self._flusher = threading.Thread(target=self._flush_loop, name="memory-flusher", daemon=True)
            self._flusher.start()

    # -- writes ---------------------------------------------------------------------------------

    def record(
        self,
        namespace: str,
        events: Sequence[Event],
        durable: bool = False,
        vocab_size: int = 0,
        only_if_empty: bool = False,
        write_id: str = "",
        digest: str = "",
        writer: str = "",
    ) -> tuple[int, int]:
        """Accept `events` into the open batch; returns (sum of counts, version that will hold them).

        Pairs may repeat within a batch (their counts add up). An empty batch writes nothing and
        returns the namespace's current version. durable=True returns only after the commit.
        vocab_size > 0 declares the writer's vocabulary (see the module doc); 0 declares none.
        only_if_empty: FailedPrecondition, nothing written, where the namespace ever recorded an event
        (buffered ones included): of several seeders of one calibration exactly one writes.
        write_id: a write accepted before with this id (and these events) is not counted again: the first
        reply is returned (after its commit, if durable); other events under a known id: InvalidArgument.
        digest: `write_ids.events_digest(events)` where the caller has it already (sorting a large write costs ms).
        writer: whose write (the service's writer identity): ResourceExhausted where its entries in the open batch
        have reached MAX_PENDING_PER_WRITER already (see the module doc).
        """
        validate_namespace(namespace)
        write_id = write_ids.validate_write_id(write_id)
        recorded = validate_events(events, self.vocab_limit(namespace, vocab_size))
        digest = (digest or write_ids.events_digest(events)) if write_id else ""
        with self._cond:
            self._check_open()
            write = self._writes.find(namespace, write_id, digest)  # a retry of it: the first reply
            if write is None:
                self._check_room(namespace, recorded, only_if_empty)
                self._check_backlog(writer, len(events))
        if write is None:
            self.declare_vocab(namespace, vocab_size)  # only once the whole request is known to be accepted
            with self._cond:  # again: the lock was let go to declare (a twin of this retry may have won)
                write = self._writes.find(namespace, write_id, digest)
                if write is None:
                    self._check_room(namespace, recorded, only_if_empty)
                    self._check_backlog(writer, len(events))
                    if not events:
                        return 0, self._versions.get(namespace, 0)
                    write = self._accept(namespace, events, recorded, write_id, digest)
                    self._open.pending[writer] += len(events)
        return self._reply(write, durable)

    def replay(self, namespace: str, write_id: str, digest: str, durable: bool = False) -> tuple[int, int] | None:
        """The first reply to an accepted write with this id and events' digest (`write_ids.events_digest`, required
        with an id; after its commit, if durable); None if the id is new.

        Lets the service answer a retry before charging the writer for it (a retry over the writer's rate would
        otherwise be refused, and a refused write's events are sent again under a new id).
        """
        if not write_id:
            return None
        with self._cond:
            self._check_open()
            write = self._writes.find(namespace, write_id, digest)
        return None if write is None else self._reply(write, durable)

    def _reply(self, write: write_ids.AcceptedWrite, durable: bool) -> tuple[int, int]:
        if durable:
            self._wait_committed(write.seq)
        return write.recorded, write.version

    def _accept(
        self, namespace: str, events: Sequence[Event], recorded: int, write_id: str, digest: str
    ) -> write_ids.AcceptedWrite:  # self._cond held
        self._totals[namespace] = self._totals.get(namespace, 0) + recorded
        counter = self._open.events.setdefault(namespace, Counter())
        for draft, target, count in events:
            counter[draft, target] += count
        self._open.totals[namespace] += recorded
        version = self._versions.get(namespace, 0) + 1  # the next take assigns exactly this
        write = write_ids.AcceptedWrite(digest, recorded, version, seq=self._assigned_seq + 1)
        if write_id:
            self._writes.add(namespace, write_id, write)
            self._open.writes.append((namespace, write_id, write))
        return write

    def flush(self) -> bool:
        """Commit the open batch (and a due decay step) now; True if something was written.

        On failure the taken batch is kept and retried by the next flush, with the same versions.
        """
        with self._flush_lock:
            if self._taken is None:
                self._taken = self._take()
            batch = self._taken
            if batch is None:
                return False
            started = time.monotonic()
            try:
                with self._transaction(write=True) as db:
                    deltas = [self._write_namespace(db, batch, ns, v) for ns, v in batch.versions.items()]
                    if batch.decay_steps:
                        db.execute(_META_SET, ("last_decay", repr(batch.decay_until)))
                    write_ids.save(db, batch.writes)
            except Exception as exc:
                with self._cond:
                    self.commit_failures += 1
                    self._failing = str(exc) if isinstance(exc, Unavailable) else f"{type(exc).__name__}: {exc}"
                raise
            self._taken = None
            with self._cond:
                self._failing = None
                self._committed.update(batch.versions)
                self._committed_seq = batch.seq
                self.committed_events += sum(batch.totals.values())
                if batch.decay_steps:
                    self._last_decay = batch.decay_until
                self._last_flush_s = time.monotonic() - started
                self._cond.notify_all()
            self.hub.publish(deltas)  # under the flush lock, so watchers see versions in order
        return True

    def vocab_limit(self, namespace: str, declared: int = 0) -> int | None:
        """The vocabulary ids of `namespace` must fit: its stored one, else `declared`; None: any id.

        Raises FailedPrecondition if `declared` contradicts the stored vocabulary.
        """
        require(_is_int(declared) and 0 <= declared <= MAX_VOCAB_SIZE, f"vocab_size out of range: {declared!r}")
        stored = self._vocab.get(namespace)
        if stored is not None and declared and declared != stored:
            raise FailedPrecondition(
                f"namespace {namespace!r} holds token ids of a vocabulary of {stored}, not {declared}: "
                "another model pair's namespace?"
            )
        return stored or declared or None

    def declare_vocab(self, namespace: str, vocab_size: int) -> None:
        """Fix the namespace's vocabulary if none is stored yet (0: declare nothing)."""
        validate_namespace(namespace)
        self.vocab_limit(namespace, vocab_size)
        if not vocab_size or namespace in self._vocab:
            return
        with self._vocab_lock:
            self.vocab_limit(namespace, vocab_size)  # again: another caller may have declared meanwhile
            if namespace in self._vocab:
                return
            with self._transaction(write=True) as db:
                db.execute(_VOCAB_SET, (namespace, vocab_size))
            self._vocab[namespace] = vocab_size
        log.info("namespace %r: vocabulary of %d tokens declared", namespace, vocab_size)

    # -- reads ----------------------------------------------------------------------------------

    def pairs(self, namespace: str, min_count: int, max_pairs: int) -> tuple[list[Pair], int]:
        """The at most `max_pairs` most frequent committed pairs with count >= min_count, and their version."""
        validate_namespace(namespace)
        require(_is_int(min_count) and min_count >= 0, f"min_count must be >= 0, got {min_count!r}")
        require(
            _is_int(max_pairs) and 1 <= max_pairs <= MAX_PAIRS_LIMIT,
            f"max_pairs must be an integer in [1, {MAX_PAIRS_LIMIT}], got {max_pairs!r}",
        )
        # No count exceeds MAX_TOTAL_EVENTS, so clamping keeps the meaning and fits SQLite's int64.
        min_count = min(min_count, MAX_TOTAL_EVENTS)
        with self._transaction(write=False) as db:
            rows = db.execute(_SELECT_PAIRS, (namespace, min_count, max_pairs)).fetchall()
            version, _ = _version_row(db, namespace)
        return [(d, t, c) for d, t, c in rows], version

    def snapshot(self, namespace: str) -> tuple[list[Pair], int]:
        """Every committed pair of a namespace (bounded by the caps) and its version: what Watch sends first."""
        return self.pairs(namespace, 1, MAX_PAIRS_LIMIT)

    def committed_version(self, namespace: str) -> int:
        with self._cond:
            return self._committed.get(namespace, 0)

    def committed_versions(self) -> dict[str, int]:
        """Every namespace written so far and its committed version."""
        with self._cond:
            return dict(self._committed)

    def stats(self, namespace: str) -> tuple[int, int, int]:
        """(total_events, distinct_pairs, version) of committed data; all 0 for a namespace never written."""
        validate_namespace(namespace)
        with self._transaction(write=False) as db:
            distinct = db.execute(_COUNT_PAIRS, (namespace,)).fetchone()[0]
            version, total = _version_row(db, namespace)
        return total, distinct, version

    def namespaces(self) -> list[NamespaceInfo]:
        """Every namespace ever written (committed), by name, with its size."""
        with self._transaction(write=False) as db:
            rows = db.execute(_LIST_NAMESPACES).fetchall()
        return [NamespaceInfo(*row) for row in rows]

    def table_stats(self, namespace: str, top_k: int = 20) -> TableStats:
        """The insight report: top pairs, top-20% share, count distribution, sizes."""
        validate_namespace(namespace)
        require(
            _is_int(top_k) and 0 <= top_k <= MAX_STATS_TOP_PAIRS,
            f"top_k must be in [0, {MAX_STATS_TOP_PAIRS}], got {top_k!r}",
        )
        with self._transaction(write=False) as db:
            counts = [row[0] for row in db.execute(_SELECT_COUNTS, (namespace,)).fetchall()]
            top = db.execute(_SELECT_PAIRS, (namespace, 1, max(top_k, 1))).fetchall()[:top_k]
            version, total = _version_row(db, namespace)
        table_events = sum(counts)
        head = counts[: math.ceil(len(counts) * TOP_SHARE_FRACTION)]
        return TableStats(
            total_events=total,
            distinct_pairs=len(counts),
            version=version,
            table_events=table_events,
            top_pairs=[(d, t, c) for d, t, c in top],
            top_share=sum(head) / table_events if table_events else 0.0,
            histogram=_histogram(counts),
            db_bytes=sum(p.stat().st_size for p in _db_files(self.db_path)),
            vocab_size=self._vocab.get(namespace, 0),
        )

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the flusher, commit what is pending, close the file. Idempotent; later calls raise Unavailable."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
        try:
            self.flush()
        except Exception:
            log.exception("final flush failed: the events accepted since the last commit are lost")
        self._let_go()
        with self._cond:
            self._cond.notify_all()  # durable waiters: give up now

    def announce(self, address: str) -> None:
        """Name the address this store's service listens on in the lock file (for a second one refused)."""
        if self.file_lock is not None:
            self.file_lock.describe(address)

    def __enter__(self) -> CorrectionStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------------

    def _let_go(self) -> None:
        """Close the database, then drop its lock (last: once the file is closed another store may take it)."""
        with self._db_lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            if self.file_lock is not None:
                self.file_lock.release()

    def _check_room(self, namespace: str, recorded: int, only_if_empty: bool = False) -> None:  # self._cond held
        self._check_open()
        if only_if_empty and self._totals.get(namespace, 0) > 0:
            raise FailedPrecondition(f"namespace {namespace!r} already holds counts; nothing was written")
        if self._totals.get(namespace, 0) + recorded > MAX_TOTAL_EVENTS:
            raise ResourceExhausted(f"namespace {namespace!r} is full: its total count would overflow")

    def check_backlog(self, namespace: str, write_id: str, writer: str, entries: int) -> None:
        """ResourceExhausted where `writer` may not add `entries` to the open batch now (see the module doc), unless
        the write is a retry of a known one: lets the service refuse such a write before reading it (each refused
        try of a 100k-entry write cost it ~0.2 s of the interpreter the flush needs)."""
        with self._cond:
            if not (write_id and self._writes.knows(namespace, write_id)):
                self._check_backlog(writer, entries)

    def _check_backlog(self, writer: str, entries: int) -> None:  # self._cond held
        pending = self._open.pending[writer]
        # full once at the share, not before: a largest legal write (an import) beside a few verifier entries of the
        # same identity was refused at every try
        if entries and pending >= MAX_PENDING_PER_WRITER:
            raise ResourceExhausted(
                f"writer {writer!r} has {pending} entries waiting for the next commit, its share of it "
                f"({MAX_PENDING_PER_WRITER}; a commit costs per pair): nothing was written, retry after the commit",
                # the open batch is taken within an interval and committed in about as long as the last commit took
                retry_after_s=(self.flush_interval_s + self._last_flush_s) if self.flush_interval_s else None,
            )

    def _check_open(self) -> None:  # self._cond held
        if self._closed:
            raise Unavailable("correction store is closed")
        if self._failing is not None:  # acknowledged writes piled up uncommitted (a full disk), lost to a crash
            raise Unavailable(
                f"the correction memory cannot commit ({self._failing}); writes are refused until a commit succeeds"
            )

    @property
    def failing(self) -> str | None:
        """Why commits fail now (writes are refused meanwhile); None while they succeed."""
        return self._failing

    def _flush_loop(self) -> None:
        # Flushes *start* every interval (not interval after the last one ended), which is what
        # bounds the age of an acknowledged, uncommitted event.
        next_at = time.monotonic() + self.flush_interval_s
        failures = 0
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.flush_interval_s
            try:
                self.flush()
            except Exception:
                failures += 1
                if failures == 1:  # a traceback every interval filled the log (a full disk: 376 in 2 minutes)
                    log.exception("flush failed; writes are refused, and the flush retried every interval")
            else:
                if failures:
                    log.warning("flushes succeed again after %d failures; writes are accepted", failures)
                failures = 0
            next_at = max(next_at, time.monotonic())  # a slow flush does not cause a burst of catch-ups

    def _take(self) -> _Batch | None:
        """Close the open batch and assign its versions; None when there is nothing to write."""
        with self._cond:
            steps, until = self._due_decay()
            if not self._open.events and not steps:
                return None
            batch, self._open = self._open, _Batch()
            namespaces = set(batch.events) | (set(self._versions) if steps else set())
            for ns in sorted(namespaces):
                self._versions[ns] = self._versions.get(ns, 0) + 1
                batch.versions[ns] = self._versions[ns]
            self._assigned_seq += 1
            batch.seq = self._assigned_seq
            batch.decay_steps, batch.decay_until = steps, until
            return batch

    def _due_decay(self) -> tuple[int, float]:
        """(whole half-lives elapsed since the last step, time of the step after applying them)."""
        half_life = self.limits.half_life_s
        if half_life <= 0:
            return 0, self._last_decay
        steps = int((self._clock() - self._last_decay) // half_life)
        return max(steps, 0), self._last_decay + max(steps, 0) * half_life

    def _write_namespace(self, db: sqlite_utils.Database, batch: _Batch, ns: str, version: int) -> Delta:
        changed: dict[Key, int] = {}
        if batch.decay_steps:
            shift = min(batch.decay_steps, 62)
            changed.update({(d, t): c for d, t, c in db.execute(_DECAY, (shift, ns)).fetchall()})
            db.execute(_DROP_ZEROS, (ns,))
        events = batch.events.get(ns, Counter())
        # executemany + one read-back per chunk of drafts: per-pair statements cost ~10x more in Python.
        db.conn.executemany(_UPSERT_PAIR, [(ns, d, t, c, version) for (d, t), c in events.items()])
        drafts = sorted({d for d, _ in events})
        for chunk in (drafts[i : i + _CHUNK] for i in range(0, len(drafts), _CHUNK)):
            marks = ",".join("?" * len(chunk))
            rows = db.execute(_SELECT_DRAFTS.format(marks=marks), (ns, *chunk)).fetchall()
            changed.update({(d, t): c for d, t, c in rows if (d, t) in events})
        # Decay only lowers counts, so only drafts with new events can have gone over their cap.
        for key in self._evict(db, ns, drafts):
            changed[key] = 0
        db.execute(_SET_VERSION, (ns, version, batch.totals.get(ns, 0)))
        return Delta(ns, version, tuple((d, t, c) for (d, t), c in sorted(changed.items())))

    def _evict(self, db: sqlite_utils.Database, ns: str, drafts: list[int]) -> list[Key]:
        """Apply the caps after a write; returns the evicted pairs."""
        evicted: list[Key] = []
        cap = self.limits.max_pairs_per_draft
        over: list[int] = []
        for chunk in (drafts[i : i + _CHUNK] for i in range(0, len(drafts), _CHUNK)):
            marks = ",".join("?" * len(chunk))
            over += [row[0] for row in db.execute(_OVER_CAP.format(marks=marks), (ns, *chunk, cap)).fetchall()]
        for draft in over:
            rows = db.execute(_EVICT_DRAFT, (ns, draft, self.limits.max_pairs_per_draft)).fetchall()
            evicted += [(d, t) for d, t in rows]
        excess = db.execute(_COUNT_PAIRS, (ns,)).fetchone()[0] - self.limits.max_pairs
        if excess > 0:
            evicted += [(d, t) for d, t in db.execute(_EVICT_GLOBAL, (ns, excess)).fetchall()]
        return evicted

    def _wait_committed(self, seq: int) -> None:
        if self._flusher is None:
            self.flush()
        with self._cond:
            done = self._cond.wait_for(lambda: self._committed_seq >= seq or self._closed, DURABLE_WAIT_S)
            if not done or self._committed_seq < seq:
                raise AcceptedNotDurable("the write was accepted but not committed in time; it may still be committed")

    def _load_state(self) -> tuple[dict[str, int], dict[str, int], float]:
        with self._transaction(write=False) as db:
            rows = db.execute("SELECT namespace, version, total_events FROM namespace_versions").fetchall()
            last_decay = float(db.execute(_META_GET, ("last_decay",)).fetchone()[0])
        return {ns: v for ns, v, _ in rows}, {ns: t for ns, _, t in rows}, last_decay

    def _load_writes(self) -> list[tuple[str, str, str, int, int]]:
        with self._transaction(write=False) as db:
            return write_ids.load(db)

    def _load_vocab(self) -> dict[str, int]:
        with self._transaction(write=False) as db:
            return dict(db.execute("SELECT namespace, vocab_size FROM namespace_vocab").fetchall())

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[sqlite_utils.Database]:
        """One transaction under the connection lock: committed if the block returns, rolled back if it raises.

        Writes take the write lock up front (BEGIN IMMEDIATE) so a second process on the same
        file makes us wait (busy timeout) rather than fail mid-transaction on a lock upgrade.
        """
        with self._db_lock:
            if self._db is None:
                raise Unavailable("correction store is closed")
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield db
                    db.commit()
                except BaseException:
                    db.rollback()
                    raise
            except sqlite3.OperationalError as exc:
                if (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF not in _UNAVAILABLE_ERRORS:
                    raise  # SQL this code got wrong is a bug (INTERNAL)
                # the file's state, not a bug (a write declaring a namespace's vocabulary on a full disk was INTERNAL)
                raise Unavailable(f"the correction memory's database: {exc}") from exc


def _histogram(counts: list[int]) -> list[CountBucket]:
    buckets: dict[int, list[int]] = {}
    for c in counts:
        buckets.setdefault(c.bit_length() - 1, [0, 0])
        buckets[c.bit_length() - 1][0] += 1
        buckets[c.bit_length() - 1][1] += c
    return [CountBucket(1 << b, (2 << b) - 1, n, e) for b, (n, e) in sorted(buckets.items())]


def _db_files(path: Path) -> list[Path]:
    candidates = [path, path.with_name(path.name + "-wal")]
    return [p for p in candidates if p.exists()]


def _version_row(db: sqlite_utils.Database, namespace: str) -> tuple[int, int]:
    """(version, total_events) of a namespace, (0, 0) if it was never written."""
    row = db.execute(_SELECT_VERSION, (namespace,)).fetchone()
    return (row[0], row[1]) if row else (0, 0)


def _lock_database(path: Path) -> DatabaseLock | None:
    """The database's lock, held (None for ':memory:'); DatabaseInUse naming the live holder."""
    try:
        return DatabaseLock.take(path)
    except (FileExistsError, NotADirectoryError) as exc:  # making its directory: a file stands in the way
        raise FailedPrecondition(
            f"cannot open the memory database {path}: {_file_in_the_way(path)} is a file, not a directory"
        ) from exc
    except OSError as exc:
        raise FailedPrecondition(f"cannot open the memory database {path}: cannot make its lock file: {exc}") from exc


def _file_in_the_way(path: Path) -> Path:
    """The one of `path`'s parents that exists and is not a directory (none below it can exist; the parent itself
    when there is none)."""
    return next((p for p in reversed(path.parents) if p.exists() and not p.is_dir()), path.parent)


def _open_database(path: Path, now: float) -> sqlite_utils.Database:
    """The database, or FailedPrecondition naming the path and the cause (corrupt, unreadable, read-only)."""
    try:
        return _connect(path, now)
    except (sqlite3.Error, OSError, FailedPrecondition) as exc:
        raise FailedPrecondition(f"cannot open the memory database {path}: {exc}") from exc


def _connect(path: Path, now: float) -> sqlite_utils.Database:
    if not path.exists():  # said: a typo in --db made a fresh, empty memory without a word (found by probing)
        log.info("no memory database at %s: a new one is made", path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # check_same_thread=False: the gRPC worker threads share this connection, serialised by our lock.
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, check_same_thread=False)
    try:
        # No plugins: nothing but our own SQL runs on this connection.
        db = sqlite_utils.Database(conn, execute_plugins=False)
        db.enable_wal()
        # A damaged page would otherwise surface at the first flush, long after start-up.
        problem = db.execute("PRAGMA quick_check").fetchone()[0]
        if problem != "ok":
            raise sqlite3.DatabaseError(f"corrupt ({problem}); restore a backup or import an export")
        db.execute("PRAGMA synchronous=FULL")  # fsync each commit: a committed flush survives power loss
        with db.atomic():  # a database refused gets no tables nor migration from this open
            _create_schema(db, now)
            check_stored_state(db, _STORED_COLUMNS)
    except BaseException:
        conn.close()
        raise
    return db


def _create_schema(db: sqlite_utils.Database, now: float) -> None:
    found = db.execute("PRAGMA user_version").fetchone()[0]
    if found > SCHEMA_VERSION:
        raise FailedPrecondition(f"database schema version {found} is newer than this server's {SCHEMA_VERSION}")
    # STRICT makes SQLite refuse a non-integer count rather than silently store a float.
    strict = db.supports_strict
    if not db["pair_counts"].exists():
        db.create_table(
            "pair_counts",
            {"namespace": str, "draft_token_id": int, "target_token_id": int, "count": int, "last_version": int},
            pk=("namespace", "draft_token_id", "target_token_id"),
            not_null=("namespace", "draft_token_id", "target_token_id", "count", "last_version"),
            defaults={"last_version": 0},
            strict=strict,
        )
    elif "last_version" not in db["pair_counts"].columns_dict:  # migration 1 -> 2
        db.execute("ALTER TABLE pair_counts ADD COLUMN last_version INTEGER NOT NULL DEFAULT 0")
    # Serves the global eviction (lowest rank first) and the count-ordered reads.
    db.execute('CREATE INDEX IF NOT EXISTS pair_counts_rank ON pair_counts (namespace, "count", last_version)')
    # total_events is kept with the version so stats are O(1) and the overflow guard is exact.
    db.create_table(
        "namespace_versions",
        {"namespace": str, "version": int, "total_events": int},
        pk="namespace",
        not_null=("namespace", "version", "total_events"),
        if_not_exists=True,
        strict=strict,
    )
    # Added after schema 2 without a version bump: a new table that older servers simply ignore.
    db.create_table(
        "namespace_vocab",
        {"namespace": str, "vocab_size": int},
        pk="namespace",
        not_null=("namespace", "vocab_size"),
        if_not_exists=True,
        strict=strict,
    )
    db.create_table("store_meta", {"key": str, "value": str}, pk="key", if_not_exists=True, strict=strict)
    write_ids.create_table(db, strict)
    # The decay clock starts when the database is created and survives restarts.
    db.execute("INSERT OR IGNORE INTO store_meta (key, value) VALUES ('last_decay', ?)", (repr(now),))
    if found < SCHEMA_VERSION:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

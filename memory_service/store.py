"""The Online Correction Memory's storage: per-namespace counts of rejected (draft, target) pairs.

Domain code only (no gRPC): bad input raises `calispec.errors` types that the service's
error interceptor maps to a status.

Storage is one SQLite file through sqlite-utils, in WAL mode with synchronous=FULL, because the
contract says RecordEvents is durable on return. One connection serves every thread, guarded by
one lock: writes to a SQLite file are serialised anyway, and a single writer makes read-modify-
write batches exactly additive without retry loops. Every request runs in a single transaction,
so a request that fails changes nothing.

Versions: each namespace has a version that counts its committed write batches (0 = never
written). Reads return the version from the same transaction as the data, so a reader knows
exactly which writes a snapshot reflects; a later watch stream can send a snapshot at version v
and then the deltas of v+1, v+2, ... .
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import sqlite_utils

from calispec.errors import FailedPrecondition, ResourceExhausted, Unavailable, require

NAMESPACE_PATTERN = re.compile(r"[A-Za-z0-9._:/-]{1,128}")
MAX_TOKEN_ID = 2**32 - 1  # ids travel as uint32 on the wire
MAX_EVENT_COUNT = 2**40  # one event this large is already a client bug, not a real tally
MAX_EVENTS_PER_RECORD = 100_000
MAX_PAIRS_LIMIT = 1_000_000  # keeps a GetPairs reply well under the 64 MiB message cap
# SQLite integers are signed 64-bit; a namespace's total is capped there so no count can overflow.
MAX_TOTAL_EVENTS = 2**63 - 1
SCHEMA_VERSION = 1  # PRAGMA user_version; bump with a migration when the tables change
BUSY_TIMEOUT_S = 5.0  # only another process (an inspector, a backup) can hold the write lock

Event = tuple[int, int, int]  # (draft_token_id, target_token_id, count)
Pair = tuple[int, int, int]  # (draft_token_id, target_token_id, count)

_UPSERT_PAIR = """
INSERT INTO pair_counts (namespace, draft_token_id, target_token_id, "count") VALUES (?, ?, ?, ?)
ON CONFLICT (namespace, draft_token_id, target_token_id) DO UPDATE SET "count" = "count" + excluded."count"
"""
_BUMP_VERSION = """
INSERT INTO namespace_versions (namespace, version, total_events) VALUES (?, 1, ?)
ON CONFLICT (namespace) DO UPDATE
SET version = version + 1, total_events = total_events + excluded.total_events
RETURNING version
"""
_SELECT_VERSION = "SELECT version, total_events FROM namespace_versions WHERE namespace = ?"
# Ties are broken by ids so equal snapshots always list pairs in the same order.
_SELECT_PAIRS = """
SELECT draft_token_id, target_token_id, "count" FROM pair_counts
WHERE namespace = ? AND "count" >= ?
ORDER BY "count" DESC, draft_token_id, target_token_id
LIMIT ?
"""
_COUNT_PAIRS = "SELECT COUNT(*) FROM pair_counts WHERE namespace = ?"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_namespace(namespace: object) -> str:
    require(isinstance(namespace, str), "namespace must be a string")
    assert isinstance(namespace, str)  # for the type checker; require() raised otherwise
    require(
        NAMESPACE_PATTERN.fullmatch(namespace) is not None,
        f"namespace must be 1-128 characters of [A-Za-z0-9._:/-], got {namespace[:140]!r}",
    )
    return namespace


def validate_events(events: Sequence[Event]) -> int:
    """Check a batch before anything is written; returns the sum of its counts."""
    if len(events) > MAX_EVENTS_PER_RECORD:
        raise ResourceExhausted(
            f"too many events in one request: {len(events)} > {MAX_EVENTS_PER_RECORD}; split the batch"
        )
    total = 0
    for i, (draft, target, count) in enumerate(events):
        for name, token in (("draft_token_id", draft), ("target_token_id", target)):
            require(
                _is_int(token) and 0 <= token <= MAX_TOKEN_ID,
                f"events[{i}].{name} must be an integer in [0, {MAX_TOKEN_ID}], got {token!r}",
            )
        require(
            _is_int(count) and 1 <= count <= MAX_EVENT_COUNT,
            f"events[{i}].count must be an integer in [1, 2**40], got {count!r}",
        )
        total += count
    return total


class CorrectionStore:
    """Thread-safe counts of rejected (draft, target) pairs, one SQLite file, versioned per namespace."""

    def __init__(self, db_path: Path | str) -> None:
        self.db_path = Path(db_path)
        self._lock = threading.Lock()
        self._db: sqlite_utils.Database | None = _open_database(self.db_path)

    # -- writes ---------------------------------------------------------------------------------

    def record(self, namespace: str, events: Sequence[Event]) -> tuple[int, int]:
        """Add `events` to the namespace's counts in one transaction; returns (sum of counts, version).

        Pairs may repeat within a batch (their counts add up). An empty batch writes nothing
        and returns the current version: versions move only when counts do.
        """
        validate_namespace(namespace)
        recorded = validate_events(events)
        if not events:
            return 0, self.stats(namespace)[2]
        with self._transaction(write=True) as db:
            _, total = _version_row(db, namespace)
            if total + recorded > MAX_TOTAL_EVENTS:
                raise ResourceExhausted(f"namespace {namespace!r} is full: its total count would overflow")
            db.conn.executemany(_UPSERT_PAIR, [(namespace, d, t, c) for d, t, c in events])
            # fetchall, not fetchone: a RETURNING statement left unfinished would block COMMIT.
            version = db.execute(_BUMP_VERSION, (namespace, recorded)).fetchall()[0][0]
        return recorded, version

    # -- reads ----------------------------------------------------------------------------------

    def pairs(self, namespace: str, min_count: int, max_pairs: int) -> tuple[list[Pair], int]:
        """The at most `max_pairs` most frequent pairs with count >= min_count, and their version."""
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

    def stats(self, namespace: str) -> tuple[int, int, int]:
        """(total_events, distinct_pairs, version) of a namespace; all 0 for one never written."""
        validate_namespace(namespace)
        with self._transaction(write=False) as db:
            distinct = db.execute(_COUNT_PAIRS, (namespace,)).fetchone()[0]
            version, total = _version_row(db, namespace)
        return total, distinct, version

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the database; waits for a request in progress. Idempotent; later calls raise Unavailable."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def __enter__(self) -> CorrectionStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[sqlite_utils.Database]:
        """One transaction under the lock: committed if the block returns, rolled back if it raises.

        Writes take the write lock up front (BEGIN IMMEDIATE) so a second process on the same
        file makes us wait (busy timeout) rather than fail mid-transaction on a lock upgrade.
        """
        with self._lock:
            if self._db is None:
                raise Unavailable("correction store is closed")
            db = self._db
            db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield db
                db.commit()
            except BaseException:
                db.rollback()
                raise


def _version_row(db: sqlite_utils.Database, namespace: str) -> tuple[int, int]:
    """(version, total_events) of a namespace, (0, 0) if it was never written."""
    row = db.execute(_SELECT_VERSION, (namespace,)).fetchone()
    return (row[0], row[1]) if row else (0, 0)


def _open_database(path: Path) -> sqlite_utils.Database:
    path.parent.mkdir(parents=True, exist_ok=True)
    # check_same_thread=False: the gRPC worker threads share this connection, serialised by our lock.
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, check_same_thread=False)
    try:
        # No plugins: nothing but our own SQL runs on this connection.
        db = sqlite_utils.Database(conn, execute_plugins=False)
        db.enable_wal()
        db.execute("PRAGMA synchronous=FULL")  # fsync each commit: durable on return
        with db.atomic():
            _create_schema(db)
    except BaseException:
        conn.close()
        raise
    return db


def _create_schema(db: sqlite_utils.Database) -> None:
    found = db.execute("PRAGMA user_version").fetchone()[0]
    if found > SCHEMA_VERSION:
        raise FailedPrecondition(f"database schema version {found} is newer than this server's {SCHEMA_VERSION}")
    # STRICT makes SQLite refuse a non-integer count rather than silently store a float.
    strict = db.supports_strict
    db.create_table(
        "pair_counts",
        {"namespace": str, "draft_token_id": int, "target_token_id": int, "count": int},
        pk=("namespace", "draft_token_id", "target_token_id"),
        not_null=("namespace", "draft_token_id", "target_token_id", "count"),
        if_not_exists=True,
        strict=strict,
    )
    # total_events is kept with the version so stats are O(1) and the overflow guard is exact.
    db.create_table(
        "namespace_versions",
        {"namespace": str, "version": int, "total_events": int},
        pk="namespace",
        not_null=("namespace", "version", "total_events"),
        if_not_exists=True,
        strict=strict,
    )
    if found < SCHEMA_VERSION:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

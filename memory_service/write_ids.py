"""Idempotent writes: the RecordEvents the store accepted, by their write_id, so that a retry counts once.

A writer whose reply was lost (a deadline, a connection that broke) cannot know whether the service
counted its events; it sends the same request again with the same write_id. The store remembers the
last MAX_WRITE_IDS ids it accepted, in memory and in the database (saved in the transaction that
commits the counts, so a restart between that commit and the retry still knows them), and answers a
retry with the first reply, counting nothing. An id reused for other events is the writer's bug:
INVALID_ARGUMENT, nothing written.

Nothing here locks: the store calls it under its own locks.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import sqlite_utils

from calispec_core.errors import InvalidArgument, require

WRITE_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,64}")
# Enough for hours of retries: a verifier writes about once a second, a retry follows within seconds.
MAX_WRITE_IDS = 65_536

Event = tuple[int, int, int]  # (draft_token_id, target_token_id, count)

_INSERT = """
INSERT OR REPLACE INTO accepted_writes (namespace, write_id, digest, recorded, version) VALUES (?, ?, ?, ?, ?)
"""
_PRUNE = "DELETE FROM accepted_writes WHERE rowid <= (SELECT MAX(rowid) FROM accepted_writes) - ?"
_LOAD = "SELECT namespace, write_id, digest, recorded, version FROM accepted_writes ORDER BY rowid DESC LIMIT ?"


@dataclass(frozen=True)
class AcceptedWrite:
    digest: str  # of the events, to tell a retry from an id reused for other events
    recorded: int  # the first reply's fields
    version: int
    seq: int = 0  # the store's batch that holds it (0: committed before this process started)


def validate_write_id(write_id: object) -> str:
    """'' (no key) or 1-64 characters of [A-Za-z0-9._:-]."""
    require(isinstance(write_id, str), "write_id must be a string")
    assert isinstance(write_id, str)  # for the type checker; require() raised otherwise
    require(
        write_id == "" or WRITE_ID_PATTERN.fullmatch(write_id) is not None,
        f"write_id must be 1-64 characters of [A-Za-z0-9._:-], got {write_id[:80]!r}",
    )
    return write_id


def events_digest(events: Sequence[Event]) -> str:
    """The same for the same multiset of events, whatever their order."""
    return hashlib.blake2b(repr(sorted(events)).encode(), digest_size=16).hexdigest()


class WriteLog:
    """The most recent accepted writes, oldest first; the store's locks guard it."""

    def __init__(self, committed: Iterable[tuple[str, str, str, int, int]] = ()) -> None:
        self._writes: OrderedDict[tuple[str, str], AcceptedWrite] = OrderedDict()
        for namespace, write_id, digest, recorded, version in committed:
            self.add(namespace, write_id, AcceptedWrite(digest, recorded, version))

    def __len__(self) -> int:
        return len(self._writes)

    def find(self, namespace: str, write_id: str, digest: str) -> AcceptedWrite | None:
        """The earlier write with this id, or None; InvalidArgument if it held other events."""
        if not write_id:
            return None
        earlier = self._writes.get((namespace, write_id))
        if earlier is not None and earlier.digest != digest:
            raise InvalidArgument(
                f"write_id {write_id!r} was already used for other events in namespace {namespace!r}; "
                "a retry must resend the same events, a new write needs a new id"
            )
        return earlier

    def knows(self, namespace: str, write_id: str) -> bool:
        return (namespace, write_id) in self._writes

    def add(self, namespace: str, write_id: str, write: AcceptedWrite) -> None:
        self._writes[namespace, write_id] = write
        self._writes.move_to_end((namespace, write_id))
        while len(self._writes) > MAX_WRITE_IDS:
            self._writes.popitem(last=False)


def create_table(db: sqlite_utils.Database, strict: bool) -> None:
    # A table added without a schema bump: older servers ignore it (and forget ids, as they always did).
    db.create_table(
        "accepted_writes",
        {"namespace": str, "write_id": str, "digest": str, "recorded": int, "version": int},
        pk=("namespace", "write_id"),
        not_null=("namespace", "write_id", "digest", "recorded", "version"),
        if_not_exists=True,
        strict=strict,
    )


def save(db: sqlite_utils.Database, writes: Sequence[tuple[str, str, AcceptedWrite]]) -> None:
    """Record the writes of one commit (in its transaction) and forget all but the newest MAX_WRITE_IDS."""
    if not writes:
        return
    db.conn.executemany(_INSERT, [(ns, wid, w.digest, w.recorded, w.version) for ns, wid, w in writes])
    db.execute(_PRUNE, (MAX_WRITE_IDS,))


def load(db: sqlite_utils.Database) -> list[tuple[str, str, str, int, int]]:
    """The newest MAX_WRITE_IDS saved writes, oldest first."""
    return list(reversed(db.execute(_LOAD, (MAX_WRITE_IDS,)).fetchall()))

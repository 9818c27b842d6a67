"""One memory service per database file: an exclusive flock on `<db>.lock`, held for the store's lifetime.

Why: two services on one file (`calispec demo` beside `calispec up`, both on the default
memory.db; an operator's second `python -m memory_service --db same.db`) each keep the
namespaces' versions, totals, vocabularies and decay clock in memory. The pair counts still add
up in SQLite, but each service publishes only its own writes to its Watch streams (its
verifiers never see the other's pairs), both number their versions from the same start (the
stored version went 30 -> 21), a vocabulary one declared is not enforced by the other, and
with --half-life each halves the counts on its own clock (1024 -> 256 in one half-life, not
512). So a second service is refused at start-up, naming the holder.

The lock is calispec_core/holder_lock.py's: the kernel drops it when the holder's process ends,
however it ends (SIGKILL, OOM), so a crashed service's lock is simply taken by the next one, with
nothing to clean up. The file names its holder (JSON: pid, host, address) only for the error line.
A sibling file rather than the database: SQLite takes its own (POSIX) locks on the database, and
its directory must be writable anyway (WAL).
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from calispec_core.errors import FailedPrecondition
from calispec_core.holder_lock import HeldElsewhere, HolderFile

IN_MEMORY = ":memory:"  # SQLite's private in-memory database: nothing on disk to share, nothing to lock


class DatabaseInUse(FailedPrecondition):
    """Another live store (this process or another) holds the database's lock."""


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    address: str = ""  # what it serves, once its server is bound ("": not recorded)

    def describe(self) -> str:
        serving = f", serving {self.address}" if self.address else ""
        return f"pid {self.pid} on {self.host}{serving}"


def lock_path(db_path: Path) -> Path:
    """`<db>.lock` beside the real file: a symlink or another spelling of the path finds the same lock."""
    real = Path(os.path.realpath(db_path))
    return real.with_name(real.name + ".lock")


class DatabaseLock:
    """The held lock of one database file; `release()` (or the process's end) lets it go."""

    def __init__(self, file: HolderFile) -> None:
        self.path = file.path
        self._file = file

    @classmethod
    def take(cls, db_path: Path) -> DatabaseLock | None:
        """Lock `db_path` at once (None for ':memory:'); DatabaseInUse naming the holder, OSError if the
        lock file cannot be made (its directory is created, as SQLite's would be)."""
        if str(db_path) == IN_MEMORY:
            return None
        path = lock_path(db_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            file = HolderFile.take(path, mode=0o644)
        except HeldElsewhere as held:
            raise DatabaseInUse(_in_use_message(db_path, path, _holder(held.record))) from None
        lock = cls(file)
        lock.describe("")
        return lock

    def describe(self, address: str) -> None:
        """Name this process (and what it serves) in the file, for a second service refused the lock."""
        if self._file.held:
            self._file.write(asdict(Holder(os.getpid(), socket.gethostname(), address)))

    def release(self) -> None:
        """Empty the file (a stale pid in it would mislead) and drop the lock; idempotent."""
        self._file.release()

    @property
    def held(self) -> bool:
        return self._file.held


def _holder(record: dict[str, Any] | None) -> Holder | None:
    """The holder the file names; None while it has not written it yet, or for a file that is not ours."""
    try:
        return Holder(int(record["pid"]), str(record["host"]), str(record.get("address", ""))) if record else None
    except (ValueError, TypeError, KeyError):
        return None


def _in_use_message(db_path: Path, path: Path, holder: Holder | None) -> str:
    who = holder.describe() if holder is not None else "holder unknown"
    return (
        f"the memory database {db_path} is in use by another memory service ({who}; lock {path}): "
        "stop it, or give this one another database file"
    )

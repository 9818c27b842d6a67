"""An exclusive `flock` on a file that names its holder: the mechanics shared by the local stack's locks
(calispec_tools/stack_state.py) and the memory service's database lock (memory_service/db_lock.py).

`flock` belongs to the open file description: the kernel drops it when the holder's process ends, however
it ends (SIGKILL, OOM), so a crashed holder's lock is simply taken by the next one, with nothing to clean
up. The file holds one JSON object naming the holder, for whoever finds the lock taken; the lock itself is
what counts. The descriptor is close-on-exec: child processes do not inherit the lock.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

MAX_RECORD_BYTES = 1 << 16


class HeldElsewhere(Exception):
    """Another open file description holds the lock; `record`: what its file names (None: unreadable)."""

    def __init__(self, record: dict[str, Any] | None) -> None:
        super().__init__("the lock is held")
        self.record = record


class HolderFile:
    """The held lock of `path`; `write()` names the holder, `release()` (or the process's end) lets it go."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def take(cls, path: Path, mode: int = 0o600) -> HolderFile:
        """Lock `path` at once (created with `mode`), or HeldElsewhere naming the holder's record (OSError: the
        path is unusable)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            record = read_record(fd)
            os.close(fd)
            raise HeldElsewhere(record) from None
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def write(self, record: dict[str, Any]) -> None:
        """Name the holder; the lock must be held."""
        assert self._fd is not None, "write() needs the lock"
        data = json.dumps(record).encode()
        os.pwrite(self._fd, data, 0)  # then cut: a reader never finds the file empty (it reads the first value)
        os.ftruncate(self._fd, len(data))

    def release(self) -> None:
        """Empty the file (a live pid left in it would still look like a holder) and drop the lock; idempotent."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            os.close(self._fd)  # the last reference to the open file description: the lock goes with it
            self._fd = None


def read_record(fd: int) -> dict[str, Any] | None:
    """The first JSON object in the file; None while none is written yet, or for a file that is not ours."""
    try:
        data, _ = json.JSONDecoder().raw_decode(os.pread(fd, MAX_RECORD_BYTES, 0).decode())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

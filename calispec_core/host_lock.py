"""One model forward at a time per host: an flock the model services on one machine share.

Why: the draft and target services on one CPU host each run a torch thread pool on the same cores.
Within a lockstep group they take turns (`coordinator/lockstep.py`), but a newcomer's prefill on one
service still lands while the group computes on the other, and two OpenMP teams on the same cores
slow each other 2-5x (a team waits at every barrier for a thread that is descheduled). Traced at
concurrency 8 on the 2-core AVX2 EPYC (wave 15, docs/performance.md "Taking turns"): 17-41 s of a
~130 s load level had both services computing at once, target prefills took 1.6-2.1 s against 0.9
alone and draft steps 2-4x their time. With this lock the two never overlap and each forward runs
at full speed on every core: `csd` at concurrency 8 went from 1.06x to 1.27x `ar` in that trace.

`flock` locks belong to an open file description, so every `HostComputeLock` (in any process,
this one included) excludes every other on the same path; the kernel drops a lock whose holder
dies, so a crashed service never blocks the other.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class HostComputeLock:
    """An exclusive flock on `path` (created if missing), taken around each compute job."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.closed = False

    def acquire(self, blocking: bool = True) -> bool:
        """Take the lock (waiting for it unless `blocking` is False); returns whether it is held."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    @contextmanager
    def held(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
            self.closed = True

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
dies, so a crashed service never blocks the other. A holder that hangs instead (a frozen process, found by
probing: a SIGSTOPped draft mid-forward made every target forward wait, `ar` requests too, until their 504) is
waited for `MAX_WAIT_S` once: then the service computes without the lock, at once, until the lock is free again.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

# The longest a job waits for the other service's forward: theirs are chunks of under a few seconds (prefills are
# chunked; loading holds no lock), so a wait this long means the holder is stuck.
MAX_WAIT_S = 10.0


class HostComputeLock:
    """An exclusive flock on `path` (created if missing), taken around each compute job."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.closed = False
        self._state = threading.Condition()
        self._waiting = False  # a waiter thread is blocked in flock
        self._granted = False  # the waiter took the lock for the one who asked
        self._stuck = False  # the last bounded wait gave up: the holder hangs

    def acquire_within(self, timeout_s: float | None = None) -> bool:
        """Take the lock, waiting at most `timeout_s` (None: `MAX_WAIT_S`; not at all while a wait before gave up
        and the holder still has it); returns whether it is held. A waiter thread does the blocking flock (it has
        no timeout) and lets the lock go at once if it gets it when nobody wants it any more."""
        with self._state:
            # not while a waiter is blocked: a flock of the same file description returns at once once the lock is
            # free, and the waiter would then let go of the lock this job holds
            if not self._waiting and self.acquire(blocking=False):
                return True
            if not self._waiting:
                self._waiting, self._granted = True, False
                threading.Thread(target=self._wait_for_lock, daemon=True, name="host-lock-waiter").start()
            timeout_s = MAX_WAIT_S if timeout_s is None else timeout_s
            if not self._stuck:
                self._state.wait_for(lambda: self._granted or not self._waiting, timeout_s)  # or the waiter failed
            if self._granted:
                self._granted = False
                return True
            if not self._stuck:
                self._stuck = True
                log.warning("the compute lock %s has been held over %g s (is the other model service frozen?): "
                            "computing without it until it is free", self.path, timeout_s)  # fmt: skip
            return False

    def _wait_for_lock(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            got = True
        except OSError as exc:  # ENOLCK on a network file system: no lock to wait for; the next job tries again
            log.warning("waiting for the compute lock %s failed: %s", self.path, exc)
            got = False
        with self._state:
            self._waiting = False
            if got and self._stuck:  # nobody waits for it any more: let it go, and wait again next time
                self._stuck = False
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                log.info("the compute lock %s is free again", self.path)
            elif got:
                self._granted = True
            if self.closed:
                os.close(self._fd)
            self._state.notify_all()

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
    def held(self) -> Iterator[bool]:
        """The lock around a job, unless its holder hangs (`acquire_within`); yields whether it is held."""
        held = self.acquire_within()
        try:
            yield held
        finally:
            if held:
                self.release()

    def close(self) -> None:
        with self._state:
            if not self.closed:
                self.closed = True
                if not self._waiting:  # else the waiter closes it when its flock returns: the fd is still in use
                    os.close(self._fd)

"""One thread per process runs torch compute: model loading, forwards and every batched step.

Why: with libgomp (torch's CPU wheels), each OS thread that starts a parallel region gets its own
OpenMP team, and once a second thread has one, small parallel ops slow down on all of them. The
0.5B int8 draft's one-token forward (2 threads, ~170 small parallel ops) took 30 ms on the thread
that loaded the model and 42-50 ms on any other thread of the same process (a gRPC handler, the
batcher); a worker thread that loaded the model and ran every forward itself took 29.5 ms. The bf16
target's few large ops did not notice. So model services hand their compute to this one thread
and wait for it (a hand-off costs tens of microseconds); code already on it runs directly.

With a `HostComputeLock` (the model services of one CPU host share one), each job handed to the
thread holds it while it runs, so the two services' forwards take turns instead of overlapping.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ParamSpec, TypeVar

from calispec_core.host_lock import HostComputeLock

P = ParamSpec("P")
T = TypeVar("T")


class ComputeThread:
    """A single long-lived worker thread that runs submitted calls in arrival order."""

    def __init__(self, name: str = "torch-compute") -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.ident = self._executor.submit(threading.get_ident).result()
        self.host_lock: HostComputeLock | None = None  # held by every job handed to the thread

    def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """fn(*args, **kwargs) on the compute thread (directly when called from it: a job already holds the
        host lock); returns or raises its outcome."""
        if threading.get_ident() == self.ident:
            return fn(*args, **kwargs)
        return self._executor.submit(self._job, fn, *args, **kwargs).result()

    def use_host_lock(self, path: Path | None) -> None:
        """Every later job holds an flock on `path` (None: no lock); the lock before is closed. Installed on
        the thread between two jobs, so no job holds the lock being closed."""
        if threading.get_ident() == self.ident:
            raise RuntimeError("a compute job cannot replace the lock it holds")
        self._executor.submit(self._install, path).result()

    def _install(self, path: Path | None) -> None:
        old, self.host_lock = self.host_lock, (HostComputeLock(path) if path is not None else None)
        if old is not None:
            old.close()

    def _job(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        lock = self.host_lock
        if lock is None:
            return fn(*args, **kwargs)
        with lock.held():  # unless the other service hangs holding it (host_lock.MAX_WAIT_S)
            return fn(*args, **kwargs)


_shared: ComputeThread | None = None
_shared_lock = threading.Lock()


def compute_thread() -> ComputeThread:
    """This process's compute thread (started on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ComputeThread()
        return _shared


def on_compute_thread(fn: Callable[P, T]) -> Callable[P, T]:
    """Decorator: every call of `fn` runs on this process's compute thread."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return compute_thread().run(fn, *args, **kwargs)

    return run

"""Ctrl-C before a process's own SIGINT handler is in: exit 130 (the shell's code for it), no traceback; and
a main thread that waits for a stop signal without missing it.

Light on purpose (no torch, no grpc): a service's `__main__` enters it before its first heavy import, since
importing torch alone takes seconds.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGINT_EXIT = 128 + signal.SIGINT  # 130
# How long a signal delivered to another thread may wait before the main thread runs its handler.
SIGNAL_POLL_S = 0.5


@contextmanager
def interrupt_exits_quietly() -> Iterator[None]:
    """Ctrl-C in the block (an import, a start-up that waits): exit 130, as for SIGINT, no traceback."""
    try:
        yield
    except KeyboardInterrupt:
        raise SystemExit(SIGINT_EXIT) from None


def wait_for_stop(stop: threading.Event) -> None:
    """Block the main thread until `stop` is set by a signal handler (or any thread).

    Polls, on purpose: the kernel may deliver a process-directed SIGTERM to any thread (gRPC's, the flusher),
    and Python runs the handler only when the main thread next executes bytecode. A bare `stop.wait()` sleeps
    in a lock that such a signal does not interrupt, so the service ignored that SIGTERM (a CI run's memory
    service did not exit in 15 s); a timed wait wakes up and runs the pending handler.
    """
    while not stop.wait(SIGNAL_POLL_S):
        pass

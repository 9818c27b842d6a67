"""Ctrl-C before a process's own SIGINT handler is in: exit 130 (the shell's code for it), no traceback.

Light on purpose (no torch, no grpc): a service's `__main__` enters it before its first heavy import, since
importing torch alone takes seconds.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

SIGINT_EXIT = 128 + signal.SIGINT  # 130


@contextmanager
def interrupt_exits_quietly() -> Iterator[None]:
    """Ctrl-C in the block (an import, a start-up that waits): exit 130, as for SIGINT, no traceback."""
    try:
        yield
    except KeyboardInterrupt:
        raise SystemExit(SIGINT_EXIT) from None

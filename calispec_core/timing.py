"""The one place where Calispec measures time: monotonic nanoseconds, named phases."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


def now_ns() -> int:
    return time.perf_counter_ns()


class Stopwatch:
    """Accumulates elapsed nanoseconds per named phase; `total_ns` runs from creation."""

    def __init__(self) -> None:
        self._start = now_ns()
        self.phases: dict[str, int] = defaultdict(int)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = now_ns()
        try:
            yield
        finally:
            self.phases[name] += now_ns() - start

    def add(self, name: str, ns: int) -> None:
        self.phases[name] += ns

    def get(self, name: str) -> int:
        return self.phases.get(name, 0)

    @property
    def total_ns(self) -> int:
        return now_ns() - self._start


def ns_to_ms(ns: int) -> float:
    return ns / 1e6


class Deadline:
    """An absolute deadline on the monotonic clock; `remaining()` is what the next call may take."""

    def __init__(self, timeout_s: float) -> None:
        self._expires_ns = now_ns() + int(timeout_s * 1e9)

    def remaining(self) -> float:
        """Seconds left; raises DeadlineExceeded when none are."""
        left = (self._expires_ns - now_ns()) / 1e9
        if left <= 0:
            from calispec_core.errors import DeadlineExceeded

            raise DeadlineExceeded("deadline exceeded")
        return left

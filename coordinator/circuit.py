"""A circuit breaker for a shared backend (the draft): skip it while it is down, probe it after a backoff.

Closed: every call goes through. After a failure it opens: callers skip the backend (the
request runs target-only) until the backoff has passed; then exactly one caller probes it
(half-open) while the others keep skipping, until it reports (or `probe_expiry_s` passes: a
prober that never reports must not keep the backend skipped for good). A success closes it; a
failure reopens it with a doubled backoff (capped), so a dead draft costs one failed call per
backoff period, not one per round, and a hung one a single stalled probe at a time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class CircuitBreaker:
    def __init__(
        self,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        probe_expiry_s: float = 60.0,
    ) -> None:
        self._lock = threading.Lock()
        self._probe_expiry_s = probe_expiry_s
        self._probe_ends = 0.0  # a probe in flight is given up on after this
        self._initial_backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._backoff_s = backoff_s
        self._clock = clock
        self._open = False
        self._probing = False
        self._retry_at = 0.0

    @property
    def is_open(self) -> bool:
        return self._open

    def allow(self) -> bool:
        """May the caller use the backend now? While open, True once per backoff period (the probe)."""
        with self._lock:
            if not self._open:
                return True
            now = self._clock()
            if now < self._retry_at or (self._probing and now < self._probe_ends):
                return False  # backing off, or one probe in flight (a hung backend holds it until its timeout)
            self._retry_at = now + self._backoff_s
            self._probing, self._probe_ends = True, now + self._probe_expiry_s
            return True

    def give_up_probe(self) -> None:
        """The caller allowed to probe never called (its request ended first): the next caller probes at once,
        instead of everyone skipping the backend until `probe_expiry_s`."""
        with self._lock:
            if self._open and self._probing:
                self._probing = False
                self._retry_at = self._clock()

    def succeeded(self) -> None:
        with self._lock:
            self._open = self._probing = False
            self._backoff_s = self._initial_backoff_s

    def failed(self) -> None:
        with self._lock:
            if self._probing:  # a failed probe waits longer next time; calls already in flight do not
                self._backoff_s = min(self._backoff_s * 2, self._max_backoff_s)
            self._open, self._probing = True, False
            self._retry_at = self._clock() + self._backoff_s

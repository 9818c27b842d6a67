"""Who may write to the correction memory, and how fast (domain code: no gRPC).

Only verifiers write: a write must present the shared writer token (see
`calispec_core.credentials`). Each writer (its claimed id, else its peer address) has a token
bucket of events per second, so one misbehaving replica cannot flood the table; a write over
the limit is refused whole (RESOURCE_EXHAUSTED) and changes nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from calispec_core.credentials import token_matches
from calispec_core.errors import ResourceExhausted, Unauthenticated

MAX_TRACKED_WRITERS = 10_000  # buckets kept; the idlest are forgotten beyond this (they were full anyway)


@dataclass
class _Bucket:
    tokens: float
    updated: float


class WriterGate:
    """Authenticates writers and applies per-writer rate limits. Thread-safe."""

    def __init__(
        self,
        token: str | None,
        events_per_s: float,
        burst_events: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # token None means writes are open to anyone: only with an explicit opt-in (see __main__).
        self._token = token
        self.events_per_s = events_per_s
        # The burst also bounds one request: an import larger than it needs a larger burst.
        self.burst = burst_events if burst_events is not None else 10 * events_per_s
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {}

    @property
    def requires_token(self) -> bool:
        return self._token is not None

    def admit(self, presented_token: str | None, writer: str, events: int) -> None:
        """Raise Unauthenticated or ResourceExhausted, or take `events` from the writer's bucket."""
        self.authenticate(presented_token)
        self.charge(writer, events)

    def authenticate(self, presented_token: str | None) -> None:
        if self._token is not None and not token_matches(self._token, presented_token):
            raise Unauthenticated("writing to the correction memory needs the verifiers' writer token")

    def charge(self, writer: str, events: int) -> None:
        """Take `events` from the writer's bucket, or raise ResourceExhausted (nothing taken)."""
        if self.events_per_s <= 0:
            return  # rate limiting disabled
        cost = max(events, 1)  # an empty write still costs a request
        with self._lock:
            now = self._clock()
            bucket = self._buckets.get(writer)
            if bucket is None:
                self._forget_idlest_if_full()
                bucket = self._buckets[writer] = _Bucket(self.burst, now)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.events_per_s)
            bucket.updated = now
            if cost > bucket.tokens:
                raise ResourceExhausted(
                    f"writer {writer!r} is over its rate limit of {self.events_per_s:g} events/s "
                    f"(burst {self.burst:g}); retry later"
                )
            bucket.tokens -= cost

    def _forget_idlest_if_full(self) -> None:
        if len(self._buckets) >= MAX_TRACKED_WRITERS:
            idlest = min(self._buckets, key=lambda w: self._buckets[w].updated)
            del self._buckets[idlest]

"""Open sessions of a model service: a capacity, an idle TTL and a reaper (no gRPC here).

A session holds a KV cache, so an abandoned one (its client crashed, or never meant to
close it) would hold a slot and memory for good: 256 of them and every Prefill is
RESOURCE_EXHAUSTED. Every use of a session (`get`) touches it; a session idle for longer
than `idle_ttl_s` is closed by `reap()`, which runs on a background thread
(`start_reaper`) and before every capacity check, so a full registry of stale sessions
still admits a new one. A session its owner is using right now (`is_busy`) is never reaped.

A session is opened through `opening(id)`, which claims its id and a slot before the prefill
computes: concurrent Prefills for the last slot (or for one id) cannot all compute a KV cache, and
hold its memory, only for all but one to be refused afterwards. A Close for a session still
prefilling (its client gave up waiting) is honoured when the prefill ends: the session is dropped
then, instead of living until its TTL. A Close can even arrive before its Prefill does (the Prefill
still queued for a worker, or on another connection): it is NOT_FOUND (the registry cannot tell that id
from one that never existed), but the id is remembered, and a Prefill of it arriving meanwhile is
refused (Cancelled) before it claims a slot or computes. Ids are remembered for one idle TTL, the last
`RECENT_IDS_KEPT` of them; a Close of an id whose session (or claim) ended within that window is only
NOT_FOUND (a second Close), so a client that reuses its ids is not refused for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from calispec_core.errors import AlreadyExists, Cancelled, NotFound, ResourceExhausted, require

log = logging.getLogger(__name__)

S = TypeVar("S")

DEFAULT_IDLE_TTL_S = 120.0  # far above one round (milliseconds), far below "abandoned"
MAX_SESSION_ID_CHARS = 128  # what a Prefill accepts (calispec_core.modeling)
RECENT_IDS_KEPT = 4096  # per kind of id remembered (128 characters at most: a few MB in all)


def valid_session_id(session_id: str) -> bool:
    """1 to MAX_SESSION_ID_CHARS characters (a Prefill refuses any other id)."""
    return 0 < len(session_id) <= MAX_SESSION_ID_CHARS


def check_session_id(session_id: str) -> None:
    """InvalidArgument for an id no Prefill accepts: looked up, it was quoted whole in NotFound's message, which
    travels in a header: an id of 16 KB failed as RESOURCE_EXHAUSTED "metadata size exceeds hard limit"."""
    require(
        valid_session_id(session_id),
        f"session_id must be 1-{MAX_SESSION_ID_CHARS} characters, got {len(session_id)}",
    )


@dataclass(frozen=True)
class SessionStats:
    open_sessions: int
    max_sessions: int
    idle_ttl_s: float  # 0: sessions never expire
    reaped_sessions: int  # closed by the reaper since start


@dataclass
class _Entry(Generic[S]):
    state: S
    last_used: float


class _RecentIds:
    """Ids with the time they were noted, oldest first, at most RECENT_IDS_KEPT (not thread-safe)."""

    def __init__(self) -> None:
        self._noted: OrderedDict[str, float] = OrderedDict()

    def note(self, session_id: str, now: float) -> None:
        self._noted[session_id] = now
        self._noted.move_to_end(session_id)
        while len(self._noted) > RECENT_IDS_KEPT:
            self._noted.popitem(last=False)

    def pop(self, session_id: str) -> bool:
        return self._noted.pop(session_id, None) is not None

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._noted

    def forget_before(self, cutoff: float) -> None:
        while self._noted and next(iter(self._noted.values())) < cutoff:
            self._noted.popitem(last=False)


class SessionRegistry(Generic[S]):
    """Thread-safe id -> session-state map with a capacity limit and an idle TTL."""

    def __init__(
        self,
        max_sessions: int,
        idle_ttl_s: float = DEFAULT_IDLE_TTL_S,
        *,
        is_busy: Callable[[S], bool] = lambda _state: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        require(max_sessions >= 1, f"max_sessions must be >= 1, got {max_sessions}")
        require(idle_ttl_s >= 0, f"session idle TTL must be >= 0 (0: never expire), got {idle_ttl_s}")
        self.max_sessions = max_sessions
        self.idle_ttl_s = idle_ttl_s
        self._is_busy = is_busy
        self._clock = clock
        self._sessions: dict[str, _Entry[S]] = {}
        self._opening: set[str] = set()  # ids claimed by prefills still computing (they hold slots)
        self._closed_opening: set[str] = set()  # of those, closed already: dropped when the prefill ends
        self._closed_early = _RecentIds()  # ids a Close found no session for: a Prefill may be on its way
        self._ended = _RecentIds()  # ids whose session or claim ended: a Close of one is a second Close
        self._lock = threading.Lock()
        self._reaped = 0
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None

    @contextmanager
    def opening(self, session_id: str) -> Iterator[Callable[[S], None]]:
        """Claim `session_id` and a slot for the block (the prefill); call what it yields with the
        session's state to open it. A block that raises, or ends without opening, frees both; so does a
        `remove` while the block runs (opening then raises Cancelled). An id no Prefill accepts is refused first: its
        claim was noted among the ended ids (up to 4096 of any size, for a TTL; found by review)."""
        check_session_id(session_id)
        self.reap()
        with self._lock:
            if self._closed_early.pop(session_id):  # one Close cancels one Prefill
                raise Cancelled(f"session {session_id!r} was closed before its prefill arrived")
            if session_id in self._sessions or session_id in self._opening:
                raise AlreadyExists(f"session {session_id!r} already exists")
            if self._taken() >= self.max_sessions:
                raise ResourceExhausted(f"session limit reached ({self.max_sessions}); retry later")
            self._opening.add(session_id)

        opened = False

        def open_session(state: S) -> None:
            nonlocal opened
            with self._lock:
                require(
                    not opened and session_id in self._opening,
                    f"session {session_id!r} opened twice or after its prefill",
                )
                if session_id in self._closed_opening:  # freed by the finally below, as any failed prefill
                    raise Cancelled(f"session {session_id!r} was closed while its prefill computed")
                self._opening.discard(session_id)  # the claim becomes the session: one slot, not two
                self._sessions[session_id] = _Entry(state, self._clock())
                opened = True

        try:
            yield open_session
        finally:
            with self._lock:
                if not opened:  # else the id may be another prefill's claim by now (closed, then reopened)
                    self._opening.discard(session_id)
                    self._closed_opening.discard(session_id)
                    self._ended.note(session_id, self._clock())

    def add(self, session_id: str, state: S) -> None:
        with self.opening(session_id) as open_session:
            open_session(state)

    def get(self, session_id: str) -> S:
        """The session's state; counts as a use (resets its idle time)."""
        check_session_id(session_id)
        with self._lock:
            entry = self._sessions.get(session_id)
            if entry is not None:
                entry.last_used = self._clock()
        if entry is None:
            raise NotFound(f"unknown session {session_id!r} (closed, expired after idling, or never opened)")
        return entry.state

    def remove(self, session_id: str) -> S | None:
        """Close the session; returns its state (None for one still prefilling: dropped when that ends). An
        unknown id is NotFound, and remembered: its Prefill may still be on its way (module docstring)."""
        check_session_id(session_id)
        with self._lock:
            entry = self._sessions.pop(session_id, None)
            if entry is not None:
                self._ended.note(session_id, self._clock())
                return entry.state
            if session_id in self._opening:
                if session_id in self._closed_opening:  # a second Close while its prefill computes (it was OK twice)
                    raise NotFound(f"unknown session {session_id!r} (closed while its prefill computed)")
                self._closed_opening.add(session_id)
                return None
            if session_id not in self._ended:  # an id no Prefill accepts was refused above
                self._closed_early.note(session_id, self._clock())
        raise NotFound(f"unknown session {session_id!r}")

    def reap(self) -> list[str]:
        """Close every session idle for longer than the TTL and not busy; returns their ids. A busy session
        counts as used at every reap, so a call longer than the TTL (the reaper runs 4 times per TTL)
        leaves its session most of a TTL after it ends, not a reap away from expiry."""
        if self.idle_ttl_s <= 0:
            return []
        with self._lock:
            now = self._clock()
            expired = []
            for sid, entry in self._sessions.items():
                if self._is_busy(entry.state):  # in use now: its idle time starts no earlier than this
                    entry.last_used = now
                elif entry.last_used < now - self.idle_ttl_s:
                    expired.append(sid)
            for sid in expired:
                del self._sessions[sid]
                self._ended.note(sid, now)
            self._reaped += len(expired)
            # a Prefill arriving a TTL after its Close opens a session that lives a TTL: the reaper's bound anyway
            self._closed_early.forget_before(now - self.idle_ttl_s)
            self._ended.forget_before(now - self.idle_ttl_s)
        if expired:
            log.info("closed %d session(s) idle for more than %gs: %s", len(expired), self.idle_ttl_s, expired[:8])
        return expired

    def stats(self) -> SessionStats:
        """Open sessions count the ones still prefilling: they hold their slots (a drain waits for them)."""
        with self._lock:
            return SessionStats(self._taken(), self.max_sessions, self.idle_ttl_s, self._reaped)

    def start_reaper(self) -> None:
        """Reap on a daemon thread, a few times per TTL, until `stop_reaper`."""
        if self.idle_ttl_s <= 0 or self._reaper is not None:
            return
        interval = max(self.idle_ttl_s / 4, 0.05)
        self._reaper = threading.Thread(target=self._reap_loop, args=(interval,), name="session-reaper", daemon=True)
        self._reaper.start()

    def stop_reaper(self) -> None:
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join()

    def _reap_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.reap()
            except Exception:  # a bug in is_busy must not end reaping for good
                log.exception("session reaper failed; retrying")

    def __contains__(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._sessions

    def __len__(self) -> int:
        """Slots taken: open sessions and prefills in flight."""
        with self._lock:
            return self._taken()

    def _taken(self) -> int:  # with the lock held
        return len(self._sessions) + len(self._opening)

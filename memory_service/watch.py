"""Change feed of the correction memory (domain code: no gRPC).

Every committed write batch of a namespace has a version; the store publishes the pairs it
changed (absolute counts, 0 = removed) as a `Delta` to the `WatchHub`, which keeps the last
`history` deltas per namespace in memory, and at most `history_pairs` pairs in all its deltas together, the
oldest of any namespace dropped first: bounded by count alone, a service fed writes of 20,000 new pairs grew by 4.7 MB
a write with no watcher at all (found by probing), and keeping each namespace's newest delta grew it by one delta per
namespace ever written (found by probing the fix). The hub knows each namespace's latest version even when its delta
is gone, so a watcher behind it resumes from a snapshot.
A watcher gets a full snapshot, then the deltas
after it; a watcher that reconnects with the version it holds resumes from the hub's history
when it still covers that version, and gets a fresh snapshot otherwise (history overflowed,
the service restarted, or the service's version went backwards after a crash).
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum

log = logging.getLogger(__name__)

Pair = tuple[int, int, int]  # (draft_token_id, target_token_id, count)
SNAPSHOT_CHUNK_PAIRS = 65_536  # keeps each stream message ~1 MB
MAX_REAPER_WAIT_S = 3600.0  # the reaper looks at its streams at least this often
HISTORY_PAIRS = 1 << 20  # pairs held by the deltas kept, all namespaces together (~140 MB of Python tuples)


@dataclass(frozen=True)
class Delta:
    namespace: str
    version: int
    changes: tuple[Pair, ...]  # absolute counts after the write; 0 = the pair was removed


class UpdateKind(Enum):
    SNAPSHOT = 1  # a chunk of a full table; `last` marks the final chunk of one snapshot
    DELTA = 2
    HEARTBEAT = 3  # nothing changed; lets both ends notice a dead peer and confirms the version


@dataclass(frozen=True)
class Update:
    kind: UpdateKind
    version: int
    pairs: tuple[Pair, ...] = ()
    last: bool = True


class WatchHub:
    """Recent deltas per namespace, and a condition watchers wait on. Thread-safe."""

    def __init__(self, history: int = 1024, history_pairs: int = HISTORY_PAIRS) -> None:
        self._history = history
        self._history_pairs = history_pairs
        self._cond = threading.Condition()
        self._deltas: dict[str, deque[Delta]] = {}  # per namespace, oldest first
        self._order: deque[tuple[str, int]] = deque()  # (namespace, version) of every delta kept, oldest first
        self._latest: dict[str, int] = {}  # each namespace's latest published version, its delta kept or not
        self._pairs = 0  # in every delta kept
        self._kept = 0  # deltas kept
        self._closed = False

    def publish(self, deltas: Iterable[Delta]) -> None:
        with self._cond:
            for delta in deltas:
                kept = self._deltas.setdefault(delta.namespace, deque())
                kept.append(delta)
                self._order.append((delta.namespace, delta.version))
                self._latest[delta.namespace] = delta.version
                self._pairs += len(delta.changes)
                self._kept += 1
                while len(kept) > self._history:
                    self._drop_oldest(delta.namespace)
            while self._pairs > self._history_pairs and self._order:
                namespace, version = self._order.popleft()
                if self._is_kept(namespace, version):  # else dropped already (by its namespace's count)
                    self._drop_oldest(namespace)
            if len(self._order) > 2 * self._kept + 64:  # most entries are of deltas their namespace's count dropped
                self._order = deque(entry for entry in self._order if self._is_kept(*entry))
            self._cond.notify_all()

    def _is_kept(self, namespace: str, version: int) -> bool:
        kept = self._deltas.get(namespace)
        return bool(kept) and kept[0].version <= version

    def _drop_oldest(self, namespace: str) -> None:
        kept = self._deltas[namespace]
        self._pairs -= len(kept.popleft().changes)
        self._kept -= 1
        if not kept:
            del self._deltas[namespace]  # a namespace written once is not held for good

    def close(self) -> None:
        """Wake every watcher; their streams end (server shutdown)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def covers(self, namespace: str, version: int, committed: int) -> bool:
        """True if the history holds every delta in (version, committed], so a resume is exact."""
        if version > committed:
            return False  # the watcher saw writes this store no longer has (lost in a crash): resync
        if version == committed:
            return True
        with self._cond:
            kept = self._deltas.get(namespace)
            return bool(kept) and kept[0].version <= version + 1 and kept[-1].version >= committed

    def since(self, namespace: str, version: int, timeout_s: float) -> list[Delta] | None:
        """Deltas newer than `version`, waiting up to timeout_s for one; None if history has a gap."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._latest.get(namespace, -1) > version, timeout_s)
            newer = [d for d in self._deltas.get(namespace, ()) if d.version > version]
            behind = self._latest.get(namespace, -1) > version
        if behind and (not newer or newer[0].version != version + 1):
            return None  # its next delta is gone: a snapshot
        return newer


class StreamReaper:
    """Cancels the streams still open past their time. A stream ends itself at its `ends_at` (`watch`), but
    gRPC's Python server waits for each message's send to complete, and a client that stopped reading while its
    connection stays open (found by probing) leaves that send waiting, so the stream never looks at its clock
    again and holds its Watch slot for good. One thread, started on demand, gone while nothing is due."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[int, tuple[float, Callable[[], None]]] = {}  # ticket -> (when, cancel)
        self._tickets = itertools.count()
        self._running = False

    def schedule(self, at: float, cancel: Callable[[], None]) -> Callable[[], None]:
        """Call `cancel` at monotonic time `at`, unless the returned function is called first (the stream ended)."""
        with self._cond:
            ticket = next(self._tickets)
            self._due[ticket] = (at, cancel)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, daemon=True, name="watch-reaper").start()
            self._cond.notify()

        def ended() -> None:
            with self._cond:
                self._due.pop(ticket, None)

        return ended

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._due:
                    self._running = False
                    return
                now = time.monotonic()
                late = [t for t, (at, _) in self._due.items() if at <= now]
                cancels = [self._due.pop(t)[1] for t in late]
                if not cancels:  # capped: a huge age (meaning "never") overflowed the wait and killed the thread
                    self._cond.wait(min(min(at for at, _ in self._due.values()) - now, MAX_REAPER_WAIT_S))
                    continue
            for cancel in cancels:
                try:
                    cancel()
                except Exception:  # one stream's failure must not end the reaping of all the others
                    log.exception("cancelling a Watch stream past its age failed")


def snapshot_updates(pairs: list[Pair], version: int) -> Iterator[Update]:
    """A snapshot as one or more chunks (an empty table is one empty chunk)."""
    chunks = [pairs[i : i + SNAPSHOT_CHUNK_PAIRS] for i in range(0, len(pairs), SNAPSHOT_CHUNK_PAIRS)] or [[]]
    for i, chunk in enumerate(chunks):
        yield Update(UpdateKind.SNAPSHOT, version, tuple(chunk), last=i == len(chunks) - 1)


def watch(
    namespace: str,
    resume_version: int | None,
    hub: WatchHub,
    read_snapshot: Callable[[], tuple[list[Pair], int]],
    committed_version: Callable[[], int],
    is_active: Callable[[], bool],
    heartbeat_s: float = 1.0,
    ends_at: float = math.inf,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Update]:
    """The update stream of one watcher: snapshot (unless resuming exactly), then deltas, until `ends_at`.

    Ends when the hub closes, `is_active()` turns false (the client went away) or `clock()` reaches `ends_at`:
    a client that stopped reading but not its connection (a frozen process, a node gone without a FIN) kept
    its Watch slot for good, its heartbeats buffered (found by probing); the watcher resumes from its version.
    """
    version = resume_version
    if version is None or not hub.covers(namespace, version, committed_version()):
        pairs, version = read_snapshot()
        yield from snapshot_updates(pairs, version)
    while is_active() and not hub.closed and clock() < ends_at:
        deltas = hub.since(namespace, version, min(heartbeat_s, max(ends_at - clock(), 0.0)))
        if deltas is None:  # fell behind the history: start over from a snapshot
            pairs, version = read_snapshot()
            yield from snapshot_updates(pairs, version)
        elif deltas:
            for delta in deltas:
                yield Update(UpdateKind.DELTA, delta.version, delta.changes)
            version = deltas[-1].version
        elif not hub.closed:
            yield Update(UpdateKind.HEARTBEAT, version)

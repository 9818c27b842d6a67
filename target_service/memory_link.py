"""The target's link to the memory service: ships rejection events, follows the table by Watch.

Two background threads, so verification never waits on the memory service:
- the *flusher* sends the table's unflushed events every `sync_interval_s` (RecordEvents, with
  the writer token: only verifiers may write);
- the *watcher* holds a Watch stream: a full snapshot, then one delta per committed write of
  the namespace, applied to a mirror of the table and installed into the `PairTable`. When the
  stream breaks it reconnects with the version it holds and resumes (or gets a new snapshot).

Installing a snapshot and handling a RecordEvents reply exclude each other (one lock), so a
snapshot never lands between "the service recorded a batch" and "we learnt its version", the
window in which `PairTable` would count that batch twice.

If the memory service is down the verifier keeps serving with its last table plus its own
local counts; `connected` turns false, the health service reports the sub-service
`MEMORY_HEALTH_SERVICE` as NOT_SERVING (the target's own health stays SERVING), and
`status()` gives the figures for metrics.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2

from calispec.v1 import memory_pb2, memory_pb2_grpc
from calispec_core.credentials import MEMORY, TlsConfig, read_writer_token, writer_metadata
from calispec_core.errors import CalispecError, FailedPrecondition
from calispec_core.grpc_server import make_channel, retry_pushback_s
from calispec_core.request_context import MAX_REQUEST_ID_CHARS, REQUEST_ID_METADATA, current_request_id
from target_service.pair_table import FlushBatch, PairTable

if TYPE_CHECKING:
    from target_service.config import TargetConfig

log = logging.getLogger(__name__)

MEMORY_HEALTH_SERVICE = "calispec.v1.TargetService/memory"
MAX_BACKOFF_S = 5.0
# Refusals that retrying will not cure: a wrong token, a token or certificate not for this namespace, a namespace
# the service refuses, or one of another vocabulary (the middle two were logged at DEBUG only; found by probing).
_CONFIG_ERRORS = (
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
)
# Refusals: the service counted nothing, so the events go back to the table (and may be sent in other
# writes). Any other failure (a deadline, a broken connection) may have come after the service counted
# the write: from then on it is sent again as it was, with the same write_id, which the service counts at
# most once, whatever a later try gets (a refusal of the retry does not show the first try was not counted).
_REFUSED = (
    *_CONFIG_ERRORS,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNIMPLEMENTED,
)
NOT_IN_USE = "not in use (unreachable, or refusing: see above): serving with the last table and local counts"
MAX_NOTED_REQUESTS = 8  # request ids named by one RecordEvents (the most recent ones)
# One RecordEvents carries at most this much; a backlog (after an outage) goes as several. The memory
# service refuses a write over 100,000 pairs or over its writer's burst (default 1,000,000 events), and
# refused whole, a backlog only grew: every later flush was refused for good. A refusal for size
# (RESOURCE_EXHAUSTED) halves the events per write, down to one; each success doubles it back.
MAX_FLUSH_PAIRS = 10_000
MAX_FLUSH_EVENTS = 100_000
MAX_WRITES_PER_FLUSH = 64  # a flush sends at most this many writes; the next flush goes on

Key = tuple[int, int]


@dataclass(frozen=True)
class LinkStatus:
    connected: bool
    version: int  # version of the table the watcher installed last (-1: none yet)
    seconds_since_update: float | None  # since the last message on the watch stream
    reconnects: int
    flush_failures: int


class MemoryLink:
    def __init__(
        self,
        address: str,
        namespace: str,
        table: PairTable,
        sync_interval_s: float = 1.0,
        rpc_timeout_s: float = 5.0,
        writer_token: str | None = None,
        writer_id: str | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        if not 0 < sync_interval_s < math.inf:  # the flusher waits this long between flushes: <= 0 spins a core
            raise ValueError(f"sync_interval_s must be a finite number > 0, got {sync_interval_s}")
        self.address = address
        self.namespace = namespace
        self.table = table
        self.sync_interval_s = sync_interval_s
        self.rpc_timeout_s = rpc_timeout_s
        self._metadata = writer_metadata(writer_token, writer_id)
        self._channel = make_channel(address, tls, server_name=MEMORY)
        self._stub = memory_pb2_grpc.MemoryServiceStub(self._channel)
        self._stop = threading.Event()
        self._install_lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._flush_loop, name="memory-flush", daemon=True),
            threading.Thread(target=self._watch_loop, name="memory-watch", daemon=True),
        ]
        self._call: grpc.Future | None = None  # the live Watch call, cancelled by stop()
        self._mirror: dict[Key, int] | None = None  # the service's table as of self._version
        self._version = -1
        self._chunks: list[tuple[int, int, int]] = []  # snapshot chunks received so far
        self._watch_ok = False
        self._flush_ok = True
        self._flush_events = MAX_FLUSH_EVENTS  # events per RecordEvents now (halved by size refusals)
        # the write being sent, its write_id, and whether a try's reply was lost (then the service may have counted it)
        self._unsettled: tuple[FlushBatch, str, bool] | None = None
        self._last_message: float | None = None
        self._reconnects = 0
        self._flush_failures = 0
        self._on_status: Callable[[bool], None] | None = None
        self._noted: dict[str, None] = {}  # request ids verified since the last flush (an ordered set)
        self._noted_lock = threading.Lock()
        self.connected = False
        self._announced = False  # whether a state was logged: a link that never came up said nothing
        self._state_lock = threading.Lock()  # both threads report the state
        self._refusal: tuple[grpc.StatusCode, str] | None = None  # the last configuration refusal logged at ERROR

    @classmethod
    def from_config(cls, config: TargetConfig, table: PairTable) -> MemoryLink:
        """The link a target's config asks for (its credential is read here, once per process)."""
        assert config.memory_address is not None
        return cls(
            config.memory_address,
            config.memory_namespace,
            table,
            sync_interval_s=config.memory_sync_interval_s,
            writer_token=read_writer_token(config.memory_writer_token_file),
            writer_id=config.address,
            tls=config.tls,
        )

    def report_health(self, health_servicer: health.HealthServicer) -> None:
        """Publish `connected` as the health of MEMORY_HEALTH_SERVICE (NOT_SERVING until the first table)."""
        serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
        with self._state_lock:  # not between an update's publication and its `connected`
            self._on_status = lambda ok: health_servicer.set(MEMORY_HEALTH_SERVICE, serving if ok else not_serving)
            self._on_status(self.connected)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop both threads, then make one last attempt to ship what is left (bounded by the RPC timeout)."""
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()
        for thread in self._threads:
            if thread.is_alive():
                thread.join()
        self.flush()
        # not local_events: those acknowledged but not yet watched back count there, and were recorded
        if left := self.table.unsent_events():  # a flush that failed, or was asked to wait (a pushback)
            log.warning("stopping with %d rejection event(s) the memory service never recorded", left)
        self._channel.close()

    def status(self) -> LinkStatus:
        last = self._last_message
        return LinkStatus(
            connected=self.connected,
            version=self._version,
            seconds_since_update=None if last is None else time.monotonic() - last,
            reconnects=self._reconnects,
            flush_failures=self._flush_failures,
        )

    def note_request(self) -> None:
        """Name the current request in the next RecordEvents (call before its round records events).

        Events are aggregated across requests, so a flush names the requests verified since the
        previous one: the write that carries a request's events names it, or an earlier one does.
        """
        request_id = current_request_id()
        if request_id is None:
            return
        with self._noted_lock:
            self._noted[request_id] = None
            while len(self._noted) > MAX_NOTED_REQUESTS:
                del self._noted[next(iter(self._noted))]

    def _take_noted(self) -> list[tuple[str, str]]:
        with self._noted_lock:
            ids, self._noted = list(self._noted), {}
        joined = ""
        for request_id in reversed(ids):  # the newest first, as many as the metadata bound allows
            candidate = f"{request_id},{joined}" if joined else request_id
            if len(candidate) > MAX_REQUEST_ID_CHARS:
                break
            joined = candidate
        return [(REQUEST_ID_METADATA, joined)] if joined else []

    # -- flusher --------------------------------------------------------------------------------

    def _flush_loop(self) -> None:
        while not self._stop.wait(self.sync_interval_s):
            self.flush()

    def flush(self) -> bool:
        """Send the unflushed events; True when there was nothing to send or the service took them."""
        with self._install_lock:
            ok = self._flush_locked()
        self._flush_ok = ok
        self._flush_failures += not ok
        self._update_connected(failed=not ok)
        return ok

    def _flush_locked(self) -> bool:
        for _ in range(MAX_WRITES_PER_FLUSH):
            sent = self._send_one()
            if sent is not True:
                return sent is None  # None: nothing (left) to send
        return True

    def _send_one(self) -> bool | None:
        """Send one write of the unflushed events (a write whose reply was lost first); None: nothing to send, or the
        service asked for them later (a pushback)."""
        if self._unsettled is None:
            batch = self.table.take_unflushed(MAX_FLUSH_PAIRS, self._flush_events)
            if batch is None:
                return None
            self._unsettled = (batch, uuid.uuid4().hex, False)
        batch, write_id, maybe_counted = self._unsettled
        events = [memory_pb2.PairCount(draft_token_id=d, target_token_id=t, count=c) for d, t, c in batch.pairs()]
        request = memory_pb2.RecordEventsRequest(
            namespace=self.namespace, events=events, vocab_size=self.table.vocab_size, write_id=write_id
        )
        try:
            metadata = [*self._metadata, *self._take_noted()]
            response = self._stub.RecordEvents(request, timeout=self.rpc_timeout_s, metadata=metadata)
        except grpc.RpcError as exc:
            if retry_pushback_s(exc) is not None:
                # "later" (this writer's share of the next commit is full, or its rate): the service is up and
                # the write's size is fine; the events go with the next flush (a resend stays the same write). Taken
                # as a failure it halved the writes and reported the memory service down (found by review).
                if not maybe_counted:
                    self._unsettled = None
                    self.table.mark_failed(batch.batch_id)
                log.debug("RecordEvents deferred: %s", exc.details())
                return None
            refused = exc.code() in _REFUSED and not maybe_counted
            if refused:
                self._unsettled = None
                self.table.mark_failed(batch.batch_id)
            else:
                self._unsettled = (batch, write_id, maybe_counted or exc.code() not in _REFUSED)
            too_big = refused and exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            if too_big:  # over the writer's burst (or its rate): smaller writes, down to one event
                self._flush_events = max(1, min(self._flush_events, int(batch.counts.sum())) // 2)
            level = self._refusal_level(exc) if exc.code() in _CONFIG_ERRORS else logging.DEBUG
            log.log(logging.WARNING if too_big else level, "RecordEvents failed: %s %s", exc.code(), exc.details())
            return False
        self._unsettled = None
        self.table.mark_flushed(batch.batch_id, response.version)
        self._flush_events = min(self._flush_events * 2, MAX_FLUSH_EVENTS)
        return True

    # -- watcher --------------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                delivered = self._watch_once()
                # the server ended the stream cleanly (its streams' age limit, or a shutdown): reconnect at once,
                # still connected until that fails (each recycled stream logged a WARNING and flipped the health);
                # a stream that ended before its first message is no sign of health (a loop of them, found by review)
                failures = 0 if delivered else failures + 1
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    return
                failures += 1
                level = self._refusal_level(exc) if exc.code() in _CONFIG_ERRORS else logging.DEBUG
                log.log(level, "watch stream broke: %s %s", exc.code(), exc.details())
            except CalispecError as exc:  # a table this verifier cannot use (e.g. wrong namespace)
                failures += 1
                self._mirror = None  # possibly half-applied: start over from a snapshot
                log.error("memory table rejected: %s", exc)
            if failures:
                self._watch_ok = False
                self._update_connected(failed=True)
            self._reconnects += 1
            self._stop.wait(min(MAX_BACKOFF_S, self.sync_interval_s * 2 ** min(failures, 8)) if failures else 0.05)

    def _watch_once(self) -> bool:
        """One Watch stream, applied until it ends; returns whether it delivered a message."""
        resume = self._version if self._mirror is not None else None
        request = memory_pb2.WatchRequest(
            namespace=self.namespace, resume_version=resume, vocab_size=self.table.vocab_size
        )
        self._chunks = []
        call = self._stub.Watch(request, metadata=self._metadata)  # a verifier's token: a Watch slot of its own
        self._call = call
        if self._stop.is_set():  # stop() ran before the call existed
            call.cancel()
        delivered = False
        for message in call:
            self._apply(message)
            delivered = True
        return delivered

    def _apply(self, message: memory_pb2.WatchResponse) -> None:
        self._last_message = time.monotonic()
        pairs = [(p.draft_token_id, p.target_token_id, p.count) for p in message.pairs]
        if message.kind == memory_pb2.WATCH_UPDATE_KIND_SNAPSHOT:
            self._chunks.extend(pairs)
            if not message.last_chunk:
                return
            mirror = {(d, t): c for d, t, c in self._chunks}
            self._chunks = []
        elif message.kind == memory_pb2.WATCH_UPDATE_KIND_DELTA:
            if self._mirror is None:
                raise FailedPrecondition("delta before snapshot")  # a protocol error: reconnect for a snapshot
            mirror = self._mirror
            for d, t, c in pairs:
                if c:
                    mirror[d, t] = c
                else:
                    mirror.pop((d, t), None)
        else:  # heartbeat: nothing changed, the stream is alive
            self._watch_ok = True
            self._update_connected()
            return
        self._install(mirror, message.version)

    def _install(self, mirror: dict[Key, int], version: int) -> None:
        pairs = [(d, t, c) for (d, t), c in mirror.items()]
        with self._install_lock:
            # An older version than ours means the service lost its last flush (crash): it is the truth now.
            self.table.replace_snapshot(pairs, version, force=version < self.table.version)
        self._mirror, self._version = mirror, version
        self._watch_ok = True
        self._update_connected()

    def _refusal_level(self, exc: grpc.RpcError) -> int:
        """ERROR for a configuration refusal the first time, DEBUG while it repeats (a write is resent every sync
        interval: an ERROR a second otherwise) until the link works again."""
        refusal = (exc.code(), exc.details() or "")
        first, self._refusal = refusal != self._refusal, refusal
        return logging.ERROR if first else logging.DEBUG

    def _update_connected(self, failed: bool = False) -> None:
        """Log and publish a change of state; and the first state, once it is known (a link that never came up said
        nothing; found by probing): working, or `failed` (a flush or the Watch failed, not merely not yet there)."""
        ok = self._watch_ok and self._flush_ok
        with self._state_lock:
            if ok == self.connected and (self._announced or not (ok or failed)):
                return
            if self._on_status is not None:  # published first: whoever sees `connected` change sees the health too
                self._on_status(ok)
            self.connected, self._announced = ok, True
        if ok:
            self._refusal = None
        state = "in use" if ok else NOT_IN_USE
        log.log(logging.INFO if ok else logging.WARNING, "memory service %s %s", self.address, state)

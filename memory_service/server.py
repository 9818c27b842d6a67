"""gRPC face of the correction memory: proto in, `CorrectionStore` / `WriterGate` call, proto out.

Handlers hold no logic of their own; validation and errors live in the domain modules and
reach clients through the shared error interceptor of `calispec_core.grpc_server`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import grpc

from calispec.v1 import memory_pb2, memory_pb2_grpc
from calispec_core.access import PeerAllowlistInterceptor, caller_identity
from calispec_core.credentials import WRITER_TOKEN_METADATA
from calispec_core.errors import CalispecError, ResourceExhausted, Unauthenticated
from calispec_core.grpc_server import create_grpc_server
from calispec_core.metrics import new_registry
from calispec_core.observability import ManagedServer, Observe
from memory_service.auth import WriterGate
from memory_service.config import MemoryConfig
from memory_service.metrics import MemoryMetrics
from memory_service.store import (
    MAX_EVENTS_PER_RECORD,
    AcceptedNotDurable,
    CorrectionStore,
    Event,
    Pair,
    validate_events,
    validate_namespace,
)
from memory_service.watch import StreamReaper, Update, UpdateKind, WatchHub, watch
from memory_service.write_ids import events_digest, validate_write_id

log = logging.getLogger(__name__)

SERVICE_NAME = memory_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name
# A valid event's bytes at most: 2 (field tag, length) + 3 tags + two uint32 ids (5 each) + a count <= 2^40 (6).
MAX_EVENT_BYTES = 21
# The largest request read: a write of the most events a request may hold, plus 1 MiB for the rest. gRPC refuses a
# larger one unread (RESOURCE_EXHAUSTED); any holder of a CA certificate could make the service read 64 MiB.
MAX_REQUEST_BYTES = MAX_EVENTS_PER_RECORD * MAX_EVENT_BYTES + 2**20
_KIND_TO_PB = {
    UpdateKind.SNAPSHOT: memory_pb2.WATCH_UPDATE_KIND_SNAPSHOT,
    UpdateKind.DELTA: memory_pb2.WATCH_UPDATE_KIND_DELTA,
    UpdateKind.HEARTBEAT: memory_pb2.WATCH_UPDATE_KIND_HEARTBEAT,
}


def _pair_counts(pairs: list[Pair] | tuple[Pair, ...]) -> list[memory_pb2.PairCount]:
    return [memory_pb2.PairCount(draft_token_id=d, target_token_id=t, count=c) for d, t, c in pairs]


def _update_to_pb(update: Update) -> memory_pb2.WatchResponse:
    return memory_pb2.WatchResponse(
        kind=_KIND_TO_PB[update.kind], version=update.version, pairs=_pair_counts(update.pairs), last_chunk=update.last
    )


def _writer_identity(gate: WriterGate, context: grpc.ServicerContext, namespace: str | None = None) -> str:
    """Who is writing, from what the caller proved (its token, its certificate), never from what
    it claims: a client-chosen header keyed the rate limit once, and a new value per call
    admitted 12 M events in 0.01 s. Unauthenticated if the token is missing or wrong, PermissionDenied
    if it may not write `namespace`."""
    token = dict(context.invocation_metadata() or ()).get(WRITER_TOKEN_METADATA)
    return gate.identify(token, certificate_name=caller_identity(context), peer=context.peer(), namespace=namespace)


@contextmanager
def _slot(slots: threading.BoundedSemaphore, whose: str) -> Iterator[None]:
    if not slots.acquire(blocking=False):
        who = f" ({whose})" if whose else ""
        raise ResourceExhausted(f"too many Watch streams open{who}; retry later, or poll GetPairs")
    try:
        yield
    finally:
        slots.release()


class MemoryServicer(memory_pb2_grpc.MemoryServiceServicer):
    def __init__(
        self, store: CorrectionStore, gate: WriterGate, config: MemoryConfig, metrics: MemoryMetrics | None = None
    ) -> None:
        self._store = store
        self._gate = gate
        self._config = config
        self._metrics = metrics or MemoryMetrics(new_registry(), store)  # a registry of its own
        limit = config.watch_stream_limit()
        self._watch_slots = threading.BoundedSemaphore(limit)
        # a Watch needs no token, so without a cap of their own one reader that never reads could hold every
        # slot (probed: 56 of 56), and a verifier that reconnects would find none
        self._reader_watch_slots = threading.BoundedSemaphore(max(limit // 2, 1))
        self._reaper = StreamReaper()

    def RecordEvents(
        self, request: memory_pb2.RecordEventsRequest, context: grpc.ServicerContext
    ) -> memory_pb2.RecordEventsResponse:
        # Order matters: strangers learn nothing (auth first); bad requests do not use up a
        # writer's budget (validation before the rate limit); nothing is buffered before both.
        try:
            writer = _writer_identity(self._gate, context, request.namespace)
            validate_namespace(request.namespace)
            validate_write_id(request.write_id)
            self._store.check_backlog(request.namespace, request.write_id, writer, len(request.events))
            events = [(e.draft_token_id, e.target_token_id, e.count) for e in request.events]
            vocab = self._store.vocab_limit(request.namespace, request.vocab_size)
            cost = validate_events(events, vocab)
            digest = events_digest(events) if request.write_id else ""  # once: a verifier's write sorts 10k pairs
            replayed = self._store.replay(request.namespace, request.write_id, digest, request.wait_durable)
            if replayed is not None:  # a retry of a write already counted: its first reply, free and not counted again
                recorded, version = replayed
                return memory_pb2.RecordEventsResponse(recorded=recorded, version=version, durable=request.wait_durable)
            self._gate.charge(writer, cost)
            recorded, version = self._record_or_refund(writer, cost, request, events, digest)
        except CalispecError as exc:
            # the entries sent, not the counts they claim: a refused write's counts are unchecked (a stranger's
            # write of 2^40 per entry inflated this counter by as much)
            self._metrics.dropped.labels(exc.code).inc(len(request.events))
            raise
        self._metrics.received.inc(recorded)
        log.debug("recorded %d events in %s (version %d)", recorded, request.namespace, version)
        return memory_pb2.RecordEventsResponse(recorded=recorded, version=version, durable=request.wait_durable)

    def _record_or_refund(
        self, writer: str, cost: int, request: memory_pb2.RecordEventsRequest, events: list[Event], digest: str
    ) -> tuple[int, int]:
        """A write the store refuses (closed, or the namespace full) changed nothing: its charge goes back."""
        try:
            return self._store.record(
                request.namespace,
                events,
                durable=request.wait_durable,
                vocab_size=request.vocab_size,
                only_if_empty=request.only_if_empty,
                write_id=request.write_id,
                digest=digest,
                writer=writer,
            )
        except AcceptedNotDurable:
            raise  # buffered: it will be committed, so it did use the budget
        except CalispecError:
            self._gate.refund(writer, cost)
            raise

    def GetPairs(
        self, request: memory_pb2.GetPairsRequest, context: grpc.ServicerContext
    ) -> memory_pb2.GetPairsResponse:
        max_pairs = request.max_pairs or self._config.max_pairs_default  # 0 = server default cap
        pairs, version = self._store.pairs(request.namespace, request.min_count, max_pairs)
        return memory_pb2.GetPairsResponse(pairs=_pair_counts(pairs), version=version)

    def GetStats(
        self, request: memory_pb2.GetStatsRequest, context: grpc.ServicerContext
    ) -> memory_pb2.GetStatsResponse:
        s = self._store.table_stats(request.namespace, request.top_k)
        limits = self._store.limits
        return memory_pb2.GetStatsResponse(
            total_events=s.total_events,
            distinct_pairs=s.distinct_pairs,
            version=s.version,
            table_events=s.table_events,
            top_pairs=_pair_counts(s.top_pairs),
            top20_share=s.top_share,
            count_histogram=[
                memory_pb2.CountBucket(min_count=b.min_count, max_count=b.max_count, pairs=b.pairs, events=b.events)
                for b in s.histogram
            ],
            db_bytes=s.db_bytes,
            max_pairs=limits.max_pairs,
            max_pairs_per_draft=limits.max_pairs_per_draft,
            half_life_s=limits.half_life_s,
            vocab_size=s.vocab_size,
        )

    def ListNamespaces(
        self, request: memory_pb2.ListNamespacesRequest, context: grpc.ServicerContext
    ) -> memory_pb2.ListNamespacesResponse:
        return memory_pb2.ListNamespacesResponse(
            namespaces=[memory_pb2.NamespaceInfo(**vars(info)) for info in self._store.namespaces()]
        )

    def Watch(
        self, request: memory_pb2.WatchRequest, context: grpc.ServicerContext
    ) -> Iterator[memory_pb2.WatchResponse]:
        with ExitStack() as slots:
            if not self._is_verifier(context):  # a reader: first one of the readers' slots
                slots.enter_context(_slot(self._reader_watch_slots, "readers without a writer token"))
            slots.enter_context(_slot(self._watch_slots, ""))
            yield from self._watch(request, context)

    def _is_verifier(self, context: grpc.ServicerContext) -> bool:
        try:
            _writer_identity(self._gate, context)
        except Unauthenticated:
            return False
        return True

    def _watch(
        self, request: memory_pb2.WatchRequest, context: grpc.ServicerContext
    ) -> Iterator[memory_pb2.WatchResponse]:
        namespace = validate_namespace(request.namespace)
        # checked, never declared: a read needs no writer token, and a stream that fixed a fresh namespace's
        # vocabulary let any reader lock every verifier out of it (FAILED_PRECONDITION for good)
        self._store.vocab_limit(namespace, request.vocab_size)
        resume = request.resume_version if request.HasField("resume_version") else None
        max_age = self._config.watch_max_age_s
        ends_at = time.monotonic() + max_age * random.uniform(1.0, 2.0)
        updates = watch(
            namespace,
            resume,
            self._store.hub,
            read_snapshot=lambda: self._store.snapshot(namespace),
            committed_version=lambda: self._store.committed_version(namespace),
            is_active=context.is_active,
            heartbeat_s=self._config.watch_heartbeat_s,
            ends_at=ends_at,
        )
        # a stream whose send still waits a quarter of its age past its end has a client that stopped reading
        ended = self._reaper.schedule(ends_at + max_age / 4, context.cancel)
        try:
            for update in updates:
                yield _update_to_pb(update)
        finally:
            ended()


def _writers_only(config: MemoryConfig) -> list[grpc.ServerInterceptor]:
    """Under mutual TLS only verifiers' certificates may write (the writer token is checked as well)."""
    if not config.tls.enabled:
        return []
    return [PeerAllowlistInterceptor(set(config.allowed_writers), f"/{SERVICE_NAME}/RecordEvents")]


def create_server(config: MemoryConfig) -> tuple[ManagedServer, int, CorrectionStore]:
    """Open the store and build a server bound to config.host:config.port (not started).

    Returns the bound port (config.port may be 0) and the store, which the caller closes
    after `server.stop()` so that no handler writes to a closed store. Close `store.hub`
    before `server.stop()` so that Watch streams end instead of holding the grace period.
    """
    store = CorrectionStore(
        config.db_path, flush_interval_s=config.flush_interval_s, limits=config.limits, hub=WatchHub()
    )
    scopes = dict(config.writer_scopes)
    gate = WriterGate(config.writer_identities(), config.writer_events_per_s, config.writer_burst_events, scopes=scopes)
    observe = Observe(metrics_port=config.metrics_port)
    servicer = MemoryServicer(store, gate, config, MemoryMetrics(observe.registry, store))
    try:
        server, port, _health = create_grpc_server(
            config.address,
            [lambda s: memory_pb2_grpc.add_MemoryServiceServicer_to_server(servicer, s)],
            [SERVICE_NAME],
            max_workers=config.max_workers,
            tls=config.tls,
            interceptors=_writers_only(config),
            health_port=config.health_port,
            observe=observe,
            max_receive_bytes=MAX_REQUEST_BYTES,
        )
    except BaseException:
        store.close()  # a failed bind must not leave the database open
        raise
    log.debug("memory service bound to %s:%d, db=%s", config.host, port, config.db_path)
    return server, port, store

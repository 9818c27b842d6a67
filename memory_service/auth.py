"""Who may write to the correction memory, and how fast (domain code: no gRPC).

Only verifiers write: a write must present a writer token (see `calispec_core.credentials`);
the token resolves to the writer's *identity* (`WriterGate.identify`), and each identity has
a token bucket of events per second, so one misbehaving replica cannot flood the table. A write
over the limit is refused whole (RESOURCE_EXHAUSTED) and changes nothing. An identity may be confined
to some namespaces (its token file line names them): a write elsewhere is PERMISSION_DENIED, so the
verifiers of one pair cannot count into, or fix the vocabulary of, another pair's table. The bucket is never
keyed on anything the client chooses (a header, its port): a fresh value per call would be a
fresh bucket per call.
"""

from __future__ import annotations

import fnmatch
import hmac
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from calispec_core.credentials import DEFAULT_WRITER_IDENTITY
from calispec_core.errors import PermissionDenied, ResourceExhausted, Unauthenticated

MAX_TRACKED_WRITERS = 10_000  # buckets kept; the idlest are forgotten beyond this (they were full anyway)


@dataclass
class _Bucket:
    tokens: float
    updated: float


def _peer_host(peer: str) -> str:
    """'ipv4:10.0.0.7:52114' -> 'ipv4:10.0.0.7': the port is the client's to choose, the host is not."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


class WriterGate:
    """Authenticates writers and applies per-identity rate limits. Thread-safe."""

    def __init__(
        self,
        tokens: Mapping[str, str] | str | None,
        events_per_s: float,
        burst_events: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        scopes: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        """tokens: identity -> token (a bare string: one token, identity "writer"); None or empty
        means writes are open to anyone: only with an explicit opt-in (see __main__). scopes: identity ->
        the namespace patterns (fnmatch) it may write; an identity without an entry writes every namespace."""
        if isinstance(tokens, str):
            tokens = {DEFAULT_WRITER_IDENTITY: tokens}
        self._tokens = [(identity, token.encode()) for identity, token in (tokens or {}).items()]
        if any(isinstance(patterns, str) for patterns in (scopes or {}).values()):  # each letter a pattern
            raise TypeError("scopes map an identity to a tuple of namespace patterns, not to one string")
        self._scopes = dict(scopes or {})
        self.events_per_s = events_per_s
        # The burst also bounds one request: an import larger than it needs a larger burst.
        self.burst = burst_events if burst_events is not None else 10 * events_per_s
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {}

    @property
    def requires_token(self) -> bool:
        return bool(self._tokens)

    def identify(
        self,
        presented_token: str | None,
        certificate_name: str | None = None,
        peer: str = "",
        namespace: str | None = None,
    ) -> str:
        """The caller's identity, or Unauthenticated: the one place a writer gets its name.

        With tokens: the identity its token names (prefixed by its mutual-TLS certificate name,
        when it has one). Open writes: the certificate name, else the peer's host. `namespace`: the
        one it writes (PermissionDenied outside its token's scope); None: it writes none (a Watch).
        """
        prefix = f"{certificate_name}/" if certificate_name else ""
        if not self._tokens:
            return certificate_name or f"anonymous@{_peer_host(peer)}"
        presented = (presented_token or "").encode()
        # Compare with every token, constant-time each, so timing says nothing about which matched.
        matches = [identity for identity, token in self._tokens if hmac.compare_digest(token, presented)]
        if not presented_token or not matches:
            raise Unauthenticated("writing to the correction memory needs a verifier's writer token")
        if namespace is not None:
            self._check_scope(matches[0], namespace)
        return prefix + matches[0]

    def _check_scope(self, identity: str, namespace: str) -> None:
        patterns = self._scopes.get(identity)
        if patterns is not None and not any(fnmatch.fnmatchcase(namespace, p) for p in patterns):
            raise PermissionDenied(
                f"writer {identity!r} may write only namespaces matching {' '.join(patterns)}, not {namespace[:140]!r}"
            )

    def admit(self, presented_token: str | None, events: int, namespace: str, peer: str = "") -> str:
        """Identify the writer of `namespace` and take `events` from its bucket; returns its identity."""
        identity = self.identify(presented_token, peer=peer, namespace=namespace)
        self.charge(identity, events)
        return identity

    def charge(self, identity: str, events: int) -> None:
        """Take `events` from the identity's bucket, or raise ResourceExhausted (nothing taken)."""
        if self.events_per_s <= 0:
            return  # rate limiting disabled
        cost = max(events, 1)  # an empty write still costs a request
        if cost > self.burst:  # RESOURCE_EXHAUSTED still: a verifier's link answers it with smaller writes
            raise ResourceExhausted(
                f"a write of {cost:g} events is larger than the writer burst of {self.burst:g}: it is never "
                "admitted; send smaller writes, or start the memory service with a larger --writer-burst"
            )
        with self._lock:
            now = self._clock()
            bucket = self._buckets.get(identity)
            if bucket is None:
                self._forget_idlest_if_full()
                bucket = self._buckets[identity] = _Bucket(self.burst, now)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.events_per_s)
            bucket.updated = now
            if cost > bucket.tokens:
                raise ResourceExhausted(
                    f"writer {identity!r} is over its rate limit of {self.events_per_s:g} events/s "
                    f"(burst {self.burst:g}); retry later",
                    retry_after_s=(cost - bucket.tokens) / self.events_per_s,  # when the bucket holds `cost`
                )
            bucket.tokens -= cost

    def refund(self, identity: str, events: int) -> None:
        """Give back a charge for a write that then changed nothing (the store refused it)."""
        if self.events_per_s <= 0:
            return
        with self._lock:
            bucket = self._buckets.get(identity)
            if bucket is not None:
                bucket.tokens = min(self.burst, bucket.tokens + max(events, 1))

    def _forget_idlest_if_full(self) -> None:
        if len(self._buckets) >= MAX_TRACKED_WRITERS:
            idlest = min(self._buckets, key=lambda w: self._buckets[w].updated)
            del self._buckets[idlest]

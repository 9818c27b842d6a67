"""The target replicas a coordinator load-balances over, changeable while it serves.

`ReplicaSet` is what the orchestrator picks a replica from (round-robin; the request then
sticks to the backend it got, unless that replica fails it). A replica that failed a request
is skipped by every request until a backoff has passed (then one request probes it), so a
dead replica costs one failed call per backoff, not one per request.

A deployment that scales verifiers (Ray, a DNS watcher, an operator) calls
`update(addresses, connect)`: new replicas are connected and checked outside the lock,
removed ones leave the rotation at once, and requests already holding a removed backend
keep using it, so they finish while the deployment drains the replica.
No deployment code here: callers hand in a `connect` function.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass

from calispec_core.credentials import TlsConfig
from calispec_core.errors import FailedPrecondition, Unavailable
from calispec_core.grpc_server import wait_for_ready
from coordinator.backends import ModelFacts, TargetBackend
from coordinator.circuit import CircuitBreaker

log = logging.getLogger(__name__)

Connect = Callable[[str], TargetBackend]


@dataclass(frozen=True)
class ReplicaChange:
    added: tuple[str, ...]
    removed: tuple[str, ...]


class ReplicaSet:
    """Thread-safe round-robin over target backends; the set may change at any time."""

    def __init__(
        self, replicas: Sequence[TargetBackend] = (), new_circuit: Callable[[], CircuitBreaker] = CircuitBreaker
    ) -> None:
        self._new_circuit = new_circuit
        self._circuits: dict[str, CircuitBreaker] = {}  # by address; created on first use
        self._lock = threading.Lock()
        self._update_lock = threading.Lock()  # one update at a time (connecting is slow)
        self._replicas: tuple[TargetBackend, ...] = tuple(replicas)
        self._cursor = 0
        self.picks: Counter[str] = Counter()  # requests routed per address (for metrics and tests)

    def __len__(self) -> int:
        return len(self._replicas)

    def addresses(self) -> list[str]:
        return [r.address for r in self._replicas]

    def backends(self) -> list[TargetBackend]:
        return list(self._replicas)

    def pick(self, exclude: Set[str] = frozenset()) -> TargetBackend:
        """The next replica not in `exclude`, preferring healthy ones; UNAVAILABLE (not a hang) when there is none."""
        with self._lock:
            usable = [r for r in self._replicas if r.address not in exclude]
            if not usable:
                left = f" (failed for this request: {', '.join(sorted(exclude))})" if exclude else ""
                raise Unavailable(f"no target replica is serving{left}")
            start = self._cursor % len(usable)
            self._cursor += 1
            rotation = usable[start:] + usable[:start]
            # all failing recently: try one anyway (it may be back) rather than refuse the request
            replica = next((r for r in rotation if self._circuit(r.address).allow()), rotation[0])
            self.picks[replica.address] += 1
            return replica

    def failed(self, address: str) -> None:
        """`address` failed a call: requests avoid it until its backoff has passed."""
        with self._lock:
            circuit = self._circuit(address)
        circuit.failed()

    def succeeded(self, address: str) -> None:
        with self._lock:
            circuit = self._circuit(address)
        circuit.succeeded()

    def _circuit(self, address: str) -> CircuitBreaker:
        if address not in self._circuits:
            self._circuits[address] = self._new_circuit()
        return self._circuits[address]

    def update(self, addresses: Sequence[str], connect: Connect) -> ReplicaChange:
        """Serve exactly `addresses`: connect the new ones (may raise; then nothing changes), drop the rest."""
        with self._update_lock:
            current = {r.address: r for r in self._replicas}
            wanted = list(dict.fromkeys(addresses))  # keep order, drop duplicates
            fresh = {a: connect(a) for a in wanted if a not in current}  # slow part, outside self._lock
            with self._lock:
                self._replicas = tuple(current.get(a) or fresh[a] for a in wanted)
                self._circuits = {a: c for a, c in self._circuits.items() if a in wanted}
            change = ReplicaChange(tuple(fresh), tuple(a for a in current if a not in wanted))
        if change.added or change.removed:
            log.info("target replicas now %s (added %s, removed %s)", wanted, change.added, change.removed)
        return change


def checked_connector(reference: ModelFacts, timeout_s: float, tls: TlsConfig | None = None) -> Connect:
    """A `connect` that opens a gRPC backend and refuses a replica whose model cannot join the set."""
    from coordinator.clients import GrpcTargetBackend  # gRPC only where a real connection is made

    def connect(address: str) -> TargetBackend:
        backend = GrpcTargetBackend(address, tls)
        wait_for_ready(backend.channel, timeout_s)
        facts = backend.info(timeout_s)
        if facts.tokenizer_fingerprint != reference.tokenizer_fingerprint:
            raise FailedPrecondition(f"target {address} uses a different tokenizer than the serving replicas")
        if facts.max_context < reference.max_context or facts.eos_token_ids != reference.eos_token_ids:
            raise FailedPrecondition(f"target {address} ({facts.model_id}) does not match the serving replicas")
        return backend

    return connect

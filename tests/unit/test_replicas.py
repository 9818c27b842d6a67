"""ReplicaSet: round-robin over a set that changes while requests are in flight."""

from __future__ import annotations

import pytest

from calispec_core.errors import Unavailable
from calispec_core.timing import Deadline
from coordinator.circuit import CircuitBreaker
from coordinator.engine import Orchestrator
from coordinator.replicas import ReplicaSet
from tests.unit.fakes import EOS, CharTokenizer, FakeDraft, FakeTarget
from tests.unit.test_circuit import Clock
from tests.unit.test_orchestrator import alphabet_target, params, sloppy_draft


def target(address: str) -> FakeTarget:
    backend = FakeTarget(alphabet_target)
    backend.address = address  # type: ignore[misc]
    return backend


def test_round_robin_and_update_keep_existing_backends() -> None:
    a, b = target("a:1"), target("b:1")
    replicas = ReplicaSet([a])
    change = replicas.update(["a:1", "b:1", "b:1"], connect=lambda addr: b)
    assert change.added == ("b:1",) and change.removed == ()
    assert [replicas.pick().address for _ in range(4)] == ["a:1", "b:1", "a:1", "b:1"]
    assert replicas.update(["b:1"], connect=pytest.fail).removed == ("a:1",)
    assert replicas.backends() == [b] and replicas.picks == {"a:1": 2, "b:1": 2}


def test_a_failed_connect_changes_nothing() -> None:
    replicas = ReplicaSet([target("a:1")])

    def refuse(address: str) -> FakeTarget:
        raise ConnectionError(address)

    with pytest.raises(ConnectionError):
        replicas.update(["a:1", "c:1"], connect=refuse)
    assert replicas.addresses() == ["a:1"]


def test_an_empty_set_fails_fast() -> None:
    replicas = ReplicaSet([target("a:1")])
    replicas.update([], connect=pytest.fail)
    with pytest.raises(Unavailable):
        replicas.pick()


def test_a_request_on_a_removed_replica_finishes() -> None:
    old, new = target("old:1"), target("new:1")
    replicas = ReplicaSet([old])
    orchestrator = Orchestrator(CharTokenizer(), FakeDraft(sloppy_draft), replicas, (EOS,), max_context=4096)
    chunks = orchestrator.generate("!w", params(), Deadline(60))
    first = next(chunks)  # the request now holds `old`
    replicas.update(["new:1"], connect=lambda addr: new)
    text = first.text + "".join(c.text for c in chunks)
    assert text == "xyz" and not old.sessions  # finished on the old replica and closed there
    assert "".join(c.text for c in orchestrator.generate("!w", params(), Deadline(60))) == "xyz"
    assert replicas.picks == {"old:1": 1, "new:1": 1}


def test_a_failed_replica_is_skipped_until_its_backoff_has_passed_then_probed() -> None:
    clock = Clock()
    replicas = ReplicaSet([target("a:1"), target("b:1")], new_circuit=lambda: CircuitBreaker(1.0, clock=clock))
    replicas.failed("a:1")
    assert [replicas.pick().address for _ in range(4)] == ["b:1"] * 4
    clock.now = 1.0
    assert [replicas.pick().address for _ in range(3)] == ["a:1", "b:1", "b:1"]  # one probe per backoff
    replicas.succeeded("a:1")
    assert {replicas.pick().address for _ in range(2)} == {"a:1", "b:1"}
    replicas.failed("a:1")
    replicas.failed("b:1")
    assert replicas.pick().address in ("a:1", "b:1")  # all failing: try one anyway rather than refuse


def test_requests_avoid_a_dead_replica_after_one_of_them_found_it() -> None:
    a, b = target("a:1"), target("b:1")
    orchestrator = Orchestrator(CharTokenizer(), FakeDraft(sloppy_draft), ReplicaSet([a, b]), (EOS,), 4096)
    a.kill()
    stats = [list(orchestrator.generate("!w", params(), Deadline(60)))[-1].stats for _ in range(4)]
    # the first request was routed to `a` first, never placed there: no failover (a.failed_calls says it tried)
    assert [s.target_failovers for s in stats] == [0, 0, 0, 0] and a.failed_calls == 1

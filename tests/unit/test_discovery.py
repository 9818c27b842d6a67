"""Target replicas discovered by DNS follow what the name resolves to."""

from __future__ import annotations

import pytest

from calispec_core.errors import InvalidArgument
from coordinator.discovery import DnsReplicaWatcher, replica_addresses
from coordinator.replicas import ReplicaSet


class Backend:
    def __init__(self, address: str) -> None:
        self.address = address


class FakeDns:
    def __init__(self, *answers: list[str] | Exception) -> None:
        self.answers = list(answers)

    def __call__(self, host: str, port: int) -> list[str]:
        assert (host, port) == ("target-pods", 50051)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_addresses_keep_the_port_and_bracket_ipv6() -> None:
    resolve = FakeDns(["10.0.0.2", "fd00::7"])
    assert replica_addresses("target-pods:50051", resolve) == ["10.0.0.2:50051", "[fd00::7]:50051"]
    with pytest.raises(InvalidArgument):
        replica_addresses("no-port", resolve)


def test_the_set_follows_scale_up_and_down_and_survives_failures() -> None:
    resolve = FakeDns(["10.0.0.1"], ["10.0.0.1", "10.0.0.2"], OSError("dns blip"), [], ["10.0.0.2"])
    replicas = ReplicaSet()
    watcher = DnsReplicaWatcher("target-pods:50051", replicas, Backend, resolve=resolve)
    assert watcher.refresh() and replicas.addresses() == ["10.0.0.1:50051"]
    assert watcher.refresh() and replicas.addresses() == ["10.0.0.1:50051", "10.0.0.2:50051"]
    kept = replicas.backends()
    assert not watcher.refresh() and replicas.backends() == kept  # a DNS failure keeps the set
    assert not watcher.refresh() and replicas.backends() == kept  # so does an empty answer
    assert watcher.refresh() and replicas.addresses() == ["10.0.0.2:50051"]
    assert replicas.backends()[0] is kept[1]  # an existing replica keeps its connection


def test_a_replica_that_fails_its_checks_changes_nothing() -> None:
    def connect(address: str) -> Backend:
        if address.startswith("10.0.0.9"):
            raise RuntimeError("different tokenizer")
        return Backend(address)

    replicas = ReplicaSet()
    watcher = DnsReplicaWatcher("target-pods:50051", replicas, connect, resolve=FakeDns(["10.0.0.1"], ["10.0.0.9"]))
    assert watcher.refresh()
    assert not watcher.refresh() and replicas.addresses() == ["10.0.0.1:50051"]

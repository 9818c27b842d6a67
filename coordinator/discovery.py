"""Finds target replicas by DNS: every address a name resolves to is one replica.

For a Kubernetes headless Service (`clusterIP: None`) the name resolves to the ready pods'
IPs, so as the HPA adds or removes target pods the coordinator's `ReplicaSet` follows: one
gRPC channel per pod, round-robin per request, instead of one channel pinned to one pod
behind a ClusterIP. No Kubernetes client needed: plain resolution, re-done periodically.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

from calispec_core.errors import InvalidArgument
from coordinator.replicas import Connect, ReplicaSet

log = logging.getLogger(__name__)

Resolver = Callable[[str, int], list[str]]  # (host, port) -> IP addresses


def resolve_all(host: str, port: int) -> list[str]:
    """Every distinct address of host (IPv4 and IPv6), sorted so the set is stable."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def split_host_port(target: str) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidArgument(f"expected HOST:PORT, got {target!r}")
    return host, int(port)


def replica_addresses(target: str, resolve: Resolver = resolve_all) -> list[str]:
    host, port = split_host_port(target)
    return [f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip in resolve(host, port)]


class DnsReplicaWatcher:
    """Re-resolves `target` every `interval_s` and makes `replicas` serve exactly what it finds."""

    def __init__(
        self,
        target: str,
        replicas: ReplicaSet,
        connect: Connect,
        interval_s: float = 10.0,
        resolve: Resolver = resolve_all,
    ) -> None:
        self.target = target
        self.replicas = replicas
        self.connect = connect
        self.interval_s = interval_s
        self.resolve = resolve
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="target-dns", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def refresh(self) -> bool:
        """One resolution and update; on failure (or an empty answer) the current set stays."""
        try:
            addresses = replica_addresses(self.target, self.resolve)
            if not addresses:
                raise OSError("no addresses")
            self.replicas.update(addresses, self.connect)
        except Exception as exc:  # a DNS blip or one bad pod must not empty a serving set
            log.warning("refreshing target replicas from %s failed: %s", self.target, exc)
            return False
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.refresh()

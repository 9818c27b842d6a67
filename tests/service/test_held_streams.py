"""Callers that open streams or connections and hold them: health Watch, reflection, /metrics.

Each is open to anyone who reaches the port (health and reflection are exempt from API keys and
roles, /metrics has no authentication), so none may take a worker the service's RPCs need.
"""

from __future__ import annotations

import socket
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from calispec_core.grpc_server import (
    HEALTH_PORT_MAX_REQUEST_BYTES,
    MAX_HEALTH_WATCHES,
    MAX_REFLECTION_STREAMS,
    create_grpc_server,
)
from calispec_core.metrics import MetricsEndpoint, new_registry, serve_metrics
from tests.helpers import rpc_code, wait_until

WORKERS = 2  # the server's pool: fewer than the streams held open in each test
DEADLINE_S = 30  # a bound for a call that would hang without the fix, not a measured time
SERVING = health_pb2.HealthCheckResponse.SERVING


@dataclass
class Ports:
    main: str  # health, reflection (and the services, none here) on `WORKERS` workers
    health: str  # the plaintext health-only port (`--health-port`)


@pytest.fixture
def ports() -> Iterator[Ports]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        health_port = probe.getsockname()[1]
    server, port, _ = create_grpc_server("127.0.0.1:0", [], [], max_workers=WORKERS, health_port=health_port)
    server.start()
    try:
        yield Ports(f"127.0.0.1:{port}", f"127.0.0.1:{health_port}")
    finally:
        server.stop(None).wait()


def _check(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S).status


def test_health_watch_streams_take_no_worker(ports: Ports) -> None:
    """Each Watch held one of the service's workers for its life: 32 Watch streams, no API key needed, stopped
    every other RPC of the coordinator. They now run on threads of their own, MAX_HEALTH_WATCHES at most."""
    with grpc.insecure_channel(ports.main) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        watches = [stub.Watch(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S) for _ in range(MAX_HEALTH_WATCHES)]
        try:
            assert MAX_HEALTH_WATCHES > WORKERS
            assert [next(w).status for w in watches] == [SERVING] * MAX_HEALTH_WATCHES
            extra = stub.Watch(health_pb2.HealthCheckRequest(), timeout=DEADLINE_S)
            assert rpc_code(lambda: next(extra)) == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert _check(ports.main) == SERVING
        finally:
            for watch in watches:
                watch.cancel()


def test_a_watch_client_that_never_reads_stalls_no_health_check(ports: Ports) -> None:
    """On the health port gRPC's Watch sent its first answer under the health servicer's lock: a client that
    never reads (a zero flow-control window) held the lock, and every Check, on every port, hung (the kubelet's
    probes too: restarts). Watch streams now send from threads of their own, under no lock."""
    never_reads = [("grpc.http2.lookahead_bytes", 0), ("grpc.http2.bdp_probe", 0)]  # its stream window stays 0
    with grpc.insecure_channel(ports.health, options=never_reads) as channel:
        # outlives the Checks' deadline: its own ending must not be what frees a stalled Check
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=4 * DEADLINE_S)
        try:
            watch.initial_metadata()  # sent with the first answer: the server is in that send now
            assert _check(ports.health) == SERVING
            assert _check(ports.main) == SERVING
        finally:
            watch.cancel()


def _held_reflection(stub: reflection_pb2_grpc.ServerReflectionStub, release: threading.Event) -> Iterator:
    """A reflection stream whose client sends one request, then keeps the stream open until `release`."""

    def requests() -> Iterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")
        release.wait()

    return stub.ServerReflectionInfo(requests(), timeout=DEADLINE_S)


def test_reflection_streams_run_on_their_own_bounded_pool(ports: Ports) -> None:
    """Reflection streams held open took the service's workers (32 stopped the coordinator, no API key needed);
    now at most MAX_REFLECTION_STREAMS run at once, on threads of their own, and one more is refused."""
    release = threading.Event()
    with grpc.insecure_channel(ports.main) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        try:
            held = [_held_reflection(stub, release) for _ in range(MAX_REFLECTION_STREAMS)]
            assert all(next(s).list_services_response.service for s in held)
            extra = _held_reflection(stub, release)
            assert rpc_code(lambda: next(extra)) == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert _check(ports.main) == SERVING
        finally:
            release.set()
        wait_until(lambda: _reflection_served(stub))  # the slots come back once the streams end


def _reflection_served(stub: reflection_pb2_grpc.ServerReflectionStub) -> bool:
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    try:
        return bool(next(stub.ServerReflectionInfo(iter([request]), timeout=DEADLINE_S)).list_services_response)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        return False


def _idle_connection(endpoint: MetricsEndpoint, start_a_request: bool = True) -> socket.socket:
    """A connection that starts a request and never finishes it (a slow-loris client)."""
    conn = socket.create_connection((endpoint.host, endpoint.port), timeout=DEADLINE_S)
    if start_a_request:
        conn.sendall(b"GET /metrics HTTP/1.1\r\n")
    return conn


def _closed_by_server(conn: socket.socket) -> bool:
    """True once the server closed `conn`; a socket timeout (the server kept it) fails the test."""
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:  # closed with bytes of ours unread
        return True


def _scraped(endpoint: MetricsEndpoint) -> bool:
    try:
        return urllib.request.urlopen(endpoint.url, timeout=DEADLINE_S).status == 200
    except OSError:  # closed unread: every connection is still taken
        return False


def test_metrics_connections_are_bounded() -> None:
    """Every connection to /metrics held a thread of the service's process for as long as it stayed open
    (300 idle connections, 300 threads); connections beyond the bound are now closed unread."""
    endpoint = serve_metrics(new_registry(), "127.0.0.1", 0, connections=2, read_timeout_s=DEADLINE_S)
    held = [_idle_connection(endpoint) for _ in range(2)]
    try:
        with _idle_connection(endpoint, start_a_request=False) as extra:
            assert _closed_by_server(extra)  # without the bound: it is served, and recv times out
        for conn in held:
            conn.close()
        wait_until(lambda: _scraped(endpoint))  # once the server saw them closed
    finally:
        for conn in held:
            conn.close()
        endpoint.stop()


def test_a_silent_metrics_connection_is_closed() -> None:
    """A connection that never completes its request was kept (and its thread) for good."""
    endpoint = serve_metrics(new_registry(), "127.0.0.1", 0, read_timeout_s=0.1)
    try:
        with _idle_connection(endpoint) as conn:
            assert _closed_by_server(conn)  # without the timeout: recv times out
        assert urllib.request.urlopen(endpoint.url, timeout=DEADLINE_S).status == 200
    finally:
        endpoint.stop()


def test_a_trickling_metrics_connection_is_closed() -> None:
    """The read timeout is per read: a client sending a byte of its request within each timeout held its slot
    (and thread) for good. Now every connection has a deadline."""
    endpoint = serve_metrics(new_registry(), "127.0.0.1", 0, read_timeout_s=DEADLINE_S, deadline_s=0.2)
    try:
        with _idle_connection(endpoint) as conn:
            conn.settimeout(0.05)  # paces the trickle: a byte, then a wait for the server's close
            assert any(_trickled_and_closed(conn) for _ in range(int(DEADLINE_S / 0.05)))
        assert urllib.request.urlopen(endpoint.url, timeout=DEADLINE_S).status == 200  # a whole scrape fits
    finally:
        endpoint.stop()


def _trickled_and_closed(conn: socket.socket) -> bool:
    try:
        conn.sendall(b"X")
        return conn.recv(1) == b""
    except TimeoutError:  # still open
        return False
    except (BrokenPipeError, ConnectionResetError):
        return True


def test_the_health_port_reads_no_large_request(ports: Ports) -> None:
    """The plaintext health port, open to anyone, read requests of up to 64 MiB (two workers)."""
    request = health_pb2.HealthCheckRequest(service="s" * HEALTH_PORT_MAX_REQUEST_BYTES)
    with grpc.insecure_channel(ports.health) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        assert rpc_code(lambda: check(request, timeout=DEADLINE_S)) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert rpc_code(lambda: check(health_pb2.HealthCheckRequest(service="s"), timeout=DEADLINE_S)) == (
            grpc.StatusCode.NOT_FOUND  # a request of its size is read: no such service
        )


def test_a_metrics_port_in_use_is_named() -> None:
    """A service given a taken --metrics-port said only "cannot start: [Errno 98] Address already in use"."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"the metrics endpoint 127.0.0.1:{port}: Address already in use"):
            serve_metrics(new_registry(), "127.0.0.1", port)

"""Loopback addresses are dialled directly (gRPC, and `bench --openai-url` over HTTP), whatever proxy is set.

gRPC sends a channel through the HTTP proxy of `grpc_proxy`, `https_proxy` or `http_proxy` unless `no_proxy` lists
the address, loopback included. With such a variable set, as on many CI runners and corporate hosts, no client
reached a service on this host and `calispec up`'s services never reached each other (found by probing the test
suite under a CI-like environment). Other addresses still follow the environment, as gRPC's own rule has it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest

from calispec._channel import ClientAuth, is_loopback
from calispec_core.grpc_server import make_channel, wait_for_ready


class Proxy:
    """A listening socket standing for the environment's proxy: it records every connection and answers none."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Proxy]:
    proxy = Proxy()
    for name in ("no_proxy", "NO_PROXY", "no_grpc_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("http_proxy", "https_proxy", "grpc_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
    yield proxy
    proxy.sock.close()


@pytest.fixture
def server_port() -> Iterator[int]:
    server = grpc.server(futures.ThreadPoolExecutor(2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    server.stop(None)


CHANNELS: dict[str, Callable[[str], grpc.Channel]] = {
    "services": make_channel,  # coordinator → draft/target, target → memory, the tools
    "sdk": lambda address: ClientAuth.resolve("", "").channel(address),
}


@pytest.mark.parametrize("make", CHANNELS.values(), ids=CHANNELS.keys())
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_loopback_channel_never_goes_through_the_proxy(proxy: Proxy, server_port: int, make, host: str) -> None:
    with make(f"{host}:{server_port}") as channel:
        wait_for_ready(channel, timeout=10)  # through the proxy: it never connects
    assert proxy.connections == 0


class Models(BaseHTTPRequestHandler):
    """An OpenAI-compatible server's model list, all `bench --openai-url` asks before its requests."""

    def do_GET(self) -> None:
        body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "x"}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


def test_bench_reaches_a_loopback_http_api_directly(proxy: Proxy) -> None:
    from calispec_tools.bench.openai_client import OpenAIStreamClient

    server = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    async def model() -> str | None:
        async with OpenAIStreamClient(f"http://127.0.0.1:{server.server_port}/v1", 10.0) as client:
            return client.model

    try:
        assert asyncio.run(model()) == "m"  # through the proxy: UNAVAILABLE (the connection closed unanswered)
    finally:
        server.shutdown()
    assert proxy.connections == 0


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:50050", True), ("127.0.0.2:1", True), ("localhost:1", True), ("[::1]:1", True),
        ("ipv4:127.0.0.1:1", True), ("dns:///localhost:1", True), ("target:50051", False), ("10.0.0.1:1", False),
        ("unix:/tmp/s.sock", False),  # no proxy dials a unix socket
    ],
)  # fmt: skip
def test_what_counts_as_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback

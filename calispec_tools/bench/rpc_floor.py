"""What one bare round trip costs on this machine: the floor under the stack's per-round overhead.

Every speculative round makes two round trips (coordinator -> draft Propose, coordinator -> target
Verify), each after the caller sat idle through a model forward. `calispec bench compare` times a
trivial RPC of each model service (`GetModelInfo`) back to back and after the caller idled
`IDLE_S`, and prints both beside its `ovh ms` column, so a round's overhead can be read against
what the transport alone costs there.

`python -m calispec_tools.bench.rpc_floor` times the same for transports with nothing of the stack
in them, each server in its own process on loopback: a gRPC unary call to a bare server with a
trivial handler (grpcio's thread-pool server, as the services run), a gRPC bidirectional stream
(one call, messages ping-ponged on it), a unary call with grpc.aio at both ends (no thread-pool
hand-off) and a raw TCP echo. On the 2-core AVX2 EPYC VMs a bare gRPC
round trip after an idle gap costs ~2.5-3 ms, a raw TCP one ~0.2 ms (docs/performance.md,
"Per-round overhead"). Nothing about time is asserted anywhere.
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import socket
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

IDLE_S = 0.03  # a short model forward; the caller sleeps this long before each timed call
CALLS = 60
WARM_UP = 10
PAYLOAD = b"x" * 100
_METHOD = "/calispec.bench.Echo/Echo"
_STREAM = "/calispec.bench.Echo/Stream"


def median_round_trip_ms(call: Callable[[], object], idle_s: float, calls: int = CALLS) -> float:
    """Median wall time of `call()` over `calls` calls, each after sleeping `idle_s` (0: back to back)."""
    for _ in range(WARM_UP):
        call()
    times = []
    for _ in range(calls):
        if idle_s:
            time.sleep(idle_s)
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def floor_of(call: Callable[[], object], calls: int = CALLS) -> dict[str, float]:
    """{"back_to_back_ms", "after_idle_ms"} for one way of making a round trip."""
    return {
        "back_to_back_ms": median_round_trip_ms(call, 0.0, calls),
        "after_idle_ms": median_round_trip_ms(call, IDLE_S, calls),
    }


def model_service_floors(draft_address: str, target_address: str, calls: int = CALLS) -> dict[str, dict[str, float]]:
    """The bare round trip to each model service of a running stack (plaintext loopback), by service."""
    from coordinator.clients import GrpcDraftBackend, GrpcTargetBackend

    floors = {}
    for name, backend in (("draft", GrpcDraftBackend(draft_address)), ("target", GrpcTargetBackend(target_address))):
        try:
            floors[name] = floor_of(lambda b=backend: b.info(timeout=30), calls)
        finally:
            backend.channel.close()
    return floors


def format_floors(floors: dict[str, dict[str, float]]) -> str:
    cells = [f"{name} {f['back_to_back_ms']:.2f} / {f['after_idle_ms']:.2f}" for name, f in floors.items()]
    return f"bare round trip (ms back to back / after {IDLE_S * 1000:.0f} ms idle): " + ", ".join(cells)


# --- transports without the stack ---------------------------------------------------------------


def _echo_stream(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
    yield from requests


def _serve_grpc(ports: multiprocessing.Queue) -> None:
    import grpc

    handlers = {
        "Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request),
        "Stream": grpc.stream_stream_rpc_method_handler(_echo_stream),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("calispec.bench.Echo", handlers),))
    ports.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    server.wait_for_termination()


def _serve_grpc_aio(ports: multiprocessing.Queue) -> None:
    import asyncio

    import grpc

    async def echo(request: bytes, context: Any) -> bytes:
        return request

    async def serve() -> None:
        server = grpc.aio.server()
        handlers = {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("calispec.bench.Echo", handlers),))
        ports.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(serve())


def _aio_floor(port: int, calls: int) -> dict[str, float]:
    """grpc.aio at both ends: no thread-pool hand-off in the server, the client's call on its event loop."""
    import asyncio

    from calispec_core.grpc_server import make_aio_channel

    async def open_channel() -> Any:  # made on the loop that will run its calls
        return make_aio_channel(f"127.0.0.1:{port}")  # the services' channel: loopback, never through a proxy

    loop = asyncio.new_event_loop()
    channel = loop.run_until_complete(open_channel())
    unary = channel.unary_unary(_METHOD)

    async def call() -> bytes:  # the call made on the running loop (no default loop needed)
        return await unary(PAYLOAD, timeout=30)

    try:
        return floor_of(lambda: loop.run_until_complete(call()), calls)
    finally:
        loop.run_until_complete(channel.close())
        loop.close()


def _serve_tcp(ports: multiprocessing.Queue) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    ports.put(listener.getsockname()[1])
    connection, _ = listener.accept()
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while data := connection.recv(len(PAYLOAD)):
        connection.sendall(data)


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the echo server closed the connection")
        data += chunk
    return data


def transport_floors(calls: int = CALLS) -> dict[str, dict[str, float]]:
    """Bare round trips by transport, each server in its own process on loopback."""
    from calispec_core.grpc_server import make_channel

    context = multiprocessing.get_context("spawn")
    ports: multiprocessing.Queue = context.Queue()
    servers = [
        context.Process(target=serve, args=(ports,), daemon=True)
        for serve in (_serve_grpc, _serve_grpc_aio, _serve_tcp)
    ]
    floors: dict[str, dict[str, float]] = {}
    try:
        servers[0].start()
        grpc_port = ports.get(timeout=60)
        with make_channel(f"127.0.0.1:{grpc_port}") as channel:
            unary = channel.unary_unary(_METHOD)
            floors["grpc unary"] = floor_of(lambda: unary(PAYLOAD, timeout=30), calls)
            outbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
            replies = channel.stream_stream(_STREAM)(iter(outbox.get, b""))

            def ping() -> bytes:
                outbox.put(PAYLOAD)
                return next(replies)

            floors["grpc stream"] = floor_of(ping, calls)
            outbox.put(b"")
        _stop(servers[0])  # alone on the machine while the next one is timed
        servers[1].start()
        floors["grpc aio"] = _aio_floor(ports.get(timeout=60), calls)
        _stop(servers[1])
        servers[2].start()
        with socket.create_connection(("127.0.0.1", ports.get(timeout=60))) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            floors["raw tcp"] = floor_of(lambda: sock.sendall(PAYLOAD) or _exactly(sock, len(PAYLOAD)), calls)
    finally:
        for server in servers:
            _stop(server)
    return floors


def _stop(server: multiprocessing.process.BaseProcess) -> None:
    if server.is_alive():
        server.terminate()
        server.join()


def main(argv: list[str] | None = None) -> int:
    from calispec_tools.bench.compare import cpu_flags, cpu_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="timed round trips per transport and gap")
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error("--calls must be >= 1")
    import grpc

    print(f"environment: cpu={cpu_model()}, cpu_flags={cpu_flags()}, grpcio={grpc.__version__}, calls={args.calls}")
    print(f"{'transport':12s} {'back to back ms':>16s} {f'after {IDLE_S * 1000:.0f} ms idle':>18s}")
    for name, floor in transport_floors(args.calls).items():
        print(f"{name:12s} {floor['back_to_back_ms']:16.3f} {floor['after_idle_ms']:18.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

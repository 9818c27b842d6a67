"""The async SDK closed under a running call raises CANCELLED as a CalispecRpcError, as the sync client does; it
raised asyncio.CancelledError, which asyncio code takes for its own task's cancellation (found by probing). The
server is a bare gRPC server whose Coordinator handlers block until the test ends."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from calispec.client import AsyncCalispecClient, CalispecRpcError

SERVICE = "calispec.v1.Coordinator"


@pytest.fixture
def blocking_coordinator() -> Iterator[tuple[str, threading.Event, threading.Event]]:
    entered, release = threading.Event(), threading.Event()

    def hold(_request: bytes, _context: grpc.ServicerContext) -> bytes:
        entered.set()
        release.wait(60)
        return b""

    def hold_stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        yield from [hold(request, context)]

    handlers = {
        "Generate": grpc.unary_unary_rpc_method_handler(hold),
        "GenerateStream": grpc.unary_stream_rpc_method_handler(hold_stream),
    }
    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", entered, release
    release.set()
    server.stop(None)


async def close_under(client: AsyncCalispecClient, call: asyncio.Task, entered: threading.Event) -> BaseException:
    assert await asyncio.to_thread(entered.wait, 30)
    await client.close()
    with pytest.raises(BaseException) as raised:
        await call
    return raised.value


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_closing_the_client_under_a_call_is_a_cancelled_rpc_error(blocking_coordinator, stream: bool) -> None:
    address, entered, _ = blocking_coordinator

    async def scenario() -> BaseException:
        client = AsyncCalispecClient(address, token="", tls_ca="")

        async def consume() -> None:
            if stream:
                async for _ in client.generate_stream("hi", timeout=60):
                    pass
            else:
                await client.generate("hi", timeout=60)

        task = asyncio.create_task(consume())
        error = await close_under(client, task, entered)
        assert not task.cancelled()
        return error

    error = asyncio.run(scenario())
    assert isinstance(error, CalispecRpcError) and error.code == "CANCELLED", repr(error)


def test_a_task_cancelled_by_its_owner_is_still_a_cancellation(blocking_coordinator) -> None:
    address, entered, _ = blocking_coordinator

    async def scenario() -> None:
        async with AsyncCalispecClient(address, token="", tls_ca="") as client:
            task = asyncio.create_task(client.generate("hi", timeout=60))
            assert await asyncio.to_thread(entered.wait, 30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(scenario())

"""The SDK against a coordinator of an older release, which drops the request fields it does not know unread.

Found by probing upgrades: the current SDK asking a wave-30 coordinator for `logprobs` / `prompt_logprobs` got
OK replies without them, and no word of it. The stand-in below answers as such a coordinator does: tokens,
no log-probabilities, no prompt report.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from calispec.client import AsyncCalispecClient, CalispecClient, CalispecRpcError
from calispec.v1 import coordinator_pb2, coordinator_pb2_grpc

LENGTH = coordinator_pb2.FinishReason.Value("FINISH_REASON_LENGTH")


class OlderCoordinator(coordinator_pb2_grpc.CoordinatorServicer):
    def Generate(self, request, context):
        return coordinator_pb2.GenerateResponse(text="ab", token_ids=[5, 6], finish_reason=LENGTH)

    def GenerateStream(self, request, context):
        yield coordinator_pb2.GenerateStreamResponse(text="a", token_ids=[5])
        yield coordinator_pb2.GenerateStreamResponse(text="b", token_ids=[6], finish_reason=LENGTH)


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    coordinator_pb2_grpc.add_CoordinatorServicer_to_server(OlderCoordinator(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


ASKED = [{"logprobs": 1}, {"prompt_logprobs": 0}]


def sync_call(address: str, stream: bool, params: dict[str, int]) -> list[int]:
    with CalispecClient(address, timeout=10, token="", tls_ca="") as client:
        if stream:
            return [t for chunk in client.generate_stream("hi", **params) for t in chunk.token_ids]
        return client.generate("hi", **params).token_ids


async def async_call(address: str, stream: bool, params: dict[str, int]) -> list[int]:
    async with AsyncCalispecClient(address, timeout=10, token="", tls_ca="") as client:
        if stream:
            return [t async for chunk in client.generate_stream("hi", **params) for t in chunk.token_ids]
        return (await client.generate("hi", **params)).token_ids


def call(address: str, kind: str, stream: bool, params: dict[str, int]) -> list[int]:
    return sync_call(address, stream, params) if kind == "sync" else asyncio.run(async_call(address, stream, params))


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("params", ASKED, ids=["logprobs", "prompt_logprobs"])
def test_log_probabilities_asked_of_an_older_coordinator_are_an_error(
    address: str, kind: str, stream: bool, params: dict[str, int]
) -> None:
    with pytest.raises(CalispecRpcError) as refused:
        call(address, kind, stream, params)
    assert refused.value.code == "FAILED_PRECONDITION" and "predates them; upgrade it" in refused.value.details


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_a_request_asking_for_none_is_served_as_before(address: str, kind: str, stream: bool) -> None:
    assert call(address, kind, stream, {}) == [5, 6]

"""The OpenAI API's event stream gives back its drain and quota slots however the response ends."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack

import pytest
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

from coordinator.engine import Chunk
from coordinator.openai_api import stream


class Event(BaseModel):
    text: str


def _held() -> tuple[ExitStack, list[str]]:
    released: list[str] = []
    held = ExitStack()
    held.callback(released.append, "slot")
    return held, released


def _chunks() -> list[Chunk]:
    return [Chunk([1], "a", "r"), Chunk([2], "b", "r")]


async def _serve(held: ExitStack, send) -> None:
    response = await stream(iter(_chunks()), held, [], lambda c: Event(text=c.text), None)

    async def receive() -> dict:
        await asyncio.Event().wait()  # the client says nothing more
        return {"type": "http.disconnect"}

    await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)


def test_a_client_gone_before_the_first_byte_still_gives_its_slot_back() -> None:
    """The body's generator never starts when the first send fails, so its own `with held` never ran: every
    such client used to keep a quota slot and the drain's count for good."""
    held, released = _held()

    async def gone(message: dict) -> None:
        raise OSError("connection reset by peer")

    with pytest.raises(ClientDisconnect):
        asyncio.run(_serve(held, gone))
    assert released == ["slot"]


def test_a_stream_that_ends_gives_its_slot_back_once() -> None:
    held, released = _held()
    body: list[bytes] = []

    async def client(message: dict) -> None:
        body.append(message.get("body", b""))

    asyncio.run(_serve(held, client))
    assert released == ["slot"]
    text = b"".join(body).decode()
    assert '"text":"a"' in text and '"text":"b"' in text and "[DONE]" in text

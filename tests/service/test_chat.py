"""Chat requests: the coordinator renders messages with the target tokenizer's chat template."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from calispec.client import AsyncCalispecClient, CalispecClient, CalispecRpcError
from calispec_tools import cli
from tests.conftest import TinyPair
from tests.service.conftest import Coordinator, ModelServices, start_coordinator

CONVERSATION = [
    {"role": "system", "content": "You count."},
    {"role": "user", "content": "def add(a, b):"},
]


@pytest.fixture(scope="module")
def client(chat_coordinator: Coordinator) -> Iterator[CalispecClient]:
    with CalispecClient(chat_coordinator.address, timeout=60) as c:
        yield c


def rendered(coordinator: Coordinator, messages: list[dict[str, str]]) -> str:
    return coordinator.orchestrator.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_chat_equals_generate_on_the_rendered_prompt(client: CalispecClient, chat_coordinator: Coordinator) -> None:
    prompt = rendered(chat_coordinator, CONVERSATION)
    assert prompt.endswith("<|assistant|>") and "<|system|>You count." in prompt
    raw = client.generate(prompt, max_new_tokens=16, mode="sd")
    chat = client.chat(CONVERSATION, max_new_tokens=16, mode="sd")
    assert chat.token_ids == raw.token_ids and chat.text == raw.text
    assert chat.stats.prompt_tokens == raw.stats.prompt_tokens
    streamed = list(client.chat_stream(CONVERSATION, max_new_tokens=16, mode="sd"))
    assert [t for c in streamed for t in c.token_ids] == chat.token_ids


def test_async_chat(chat_coordinator: Coordinator, client: CalispecClient) -> None:
    async def run() -> tuple[list[int], list[int]]:
        async with AsyncCalispecClient(chat_coordinator.address, timeout=60) as c:
            unary = await c.chat(CONVERSATION, max_new_tokens=8, mode="ar")
            chunks = [chunk async for chunk in c.chat_stream(CONVERSATION, max_new_tokens=8, mode="ar")]
            streamed = [t for chunk in chunks for t in chunk.token_ids]
            return unary.token_ids, streamed

    unary, streamed = asyncio.run(run())
    assert unary == streamed == client.chat(CONVERSATION, max_new_tokens=8, mode="ar").token_ids


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([], "must not be empty"),
        ([{"role": "robot", "content": "hi"}], "role must be one of"),
        ([{"role": "user", "content": "hi"}, {"role": "", "content": "x"}], "messages[1].role"),
        (
            [{"role": "tool", "content": "4"}],
            "messages[0].role 'tool' is not supported: tool calls and their results need",
        ),
    ],
)
def test_bad_messages_are_invalid_argument(client: CalispecClient, messages: list, fragment: str) -> None:
    with pytest.raises(CalispecRpcError) as info:
        client.chat(messages, max_new_tokens=4)
    assert info.value.code == "INVALID_ARGUMENT" and fragment in info.value.details


def test_chat_without_a_template_is_invalid_argument(model_services: ModelServices, tiny_pair: TinyPair) -> None:
    server, plain = start_coordinator(model_services, tiny_pair.target)  # the tiny tokenizer has no template
    try:
        with CalispecClient(plain.address, timeout=60) as c:
            with pytest.raises(CalispecRpcError) as info:
                c.chat(CONVERSATION, max_new_tokens=4)
            assert info.value.code == "INVALID_ARGUMENT" and "chat template" in info.value.details
            assert c.generate("def add(a, b):", max_new_tokens=4).token_ids  # raw prompts still work
    finally:
        server.stop(None)


def test_cli_chat_one_shot_prints_the_reply(
    chat_coordinator: Coordinator, client: CalispecClient, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["chat", "--address", chat_coordinator.address, "-m", "def add(a, b):", "--system", "You count."]
    assert cli.main([*argv, "--max-new-tokens", "12", "--mode", "ar"]) == 0
    expected = client.chat(CONVERSATION, max_new_tokens=12, mode="ar").text
    assert capsys.readouterr().out == expected + "\n"


def test_cli_chat_one_shot_reports_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["chat", "--address", "127.0.0.1:1", "-m", "hi", "--timeout", "2"]) == 1
    assert "error: UNAVAILABLE" in capsys.readouterr().err

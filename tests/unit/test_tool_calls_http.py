"""Tool calls through the HTTP API end to end, over an orchestrator whose replies are scripted: the tiny pair never
writes a call, so its service tests (tests/service/test_openai_api.py) show only that tools reach the prompt."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import openai
import pytest
from starlette.testclient import TestClient

from calispec_core.generation import ConstraintKind, Defaults, FinishReason, GenerationStats
from coordinator.engine import Chunk
from coordinator.openai_api import ApiSettings, create_app

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


class Template:
    chat_template, bos_token = "t", None

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, continue_final_message, tools=None):
        return json.dumps({"messages": messages, "tools": tools})


class Scripted:
    """An orchestrator whose every choice writes `reply` in pieces of `piece` characters, ending `finish`."""

    def __init__(self) -> None:
        self.tokenizer = Template()
        self.context_length, self.replicas = 4096, [object()]
        self.lockstep = SimpleNamespace(leave=lambda request_id: None)
        self.reply, self.piece, self.finish = "", 5, FinishReason.EOS
        self.prompts: list[str] = []
        self.params: list[Any] = []  # each choice's GenerationParams

    def generate(
        self, prompt: str, params: Any, deadline: Any, cancelled: Any, fits: Any, on_start: Any
    ) -> Iterator[Chunk]:
        self.prompts.append(prompt)
        self.params.append(params)
        pieces = [self.reply[i : i + self.piece] for i in range(0, len(self.reply), self.piece)] or [""]
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            stats = GenerationStats(prompt_tokens=7) if last else None
            yield Chunk([1] * max(len(piece), 1), piece, "r", self.finish if last else None, stats)


@pytest.fixture
def served() -> Iterator[tuple[Scripted, TestClient]]:
    scripted = Scripted()
    app = create_app(scripted, ApiSettings("m", Defaults(), 60.0, tool_call_parser="hermes"))  # type: ignore[arg-type]
    with TestClient(app) as client:
        yield scripted, client


def chat(client: TestClient, **extra: Any) -> dict[str, Any]:
    response = client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, "tools": TOOLS, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def events(client: TestClient, **extra: Any) -> list[dict[str, Any]]:
    body = {"model": "m", "messages": MESSAGES, "tools": TOOLS, "stream": True, **extra}
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        lines = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_a_unary_reply_with_calls_reads_as_openais(served: tuple[Scripted, TestClient]) -> None:
    scripted, client = served
    scripted.reply = f"Checking.\n{CALL}"
    body = chat(client, n=2)
    assert json.loads(scripted.prompts[0])["tools"] == TOOLS  # the template was given the tools
    for choice in body["choices"]:
        message = choice["message"]
        assert choice["finish_reason"] == "tool_calls" and message["content"] == "Checking.\n"
        [call] = message["tool_calls"]
        assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
        assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    ids = {c["message"]["tool_calls"][0]["id"] for c in body["choices"]}
    assert len(ids) == 2  # each choice's call its own id
    openai.types.chat.ChatCompletion.model_validate(body)  # the SDK reads it


def test_a_reply_without_calls_has_no_tool_calls_key(served: tuple[Scripted, TestClient]) -> None:
    scripted, client = served
    scripted.reply = "It is sunny <tools> maybe."
    message = chat(client)["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "It is sunny <tools> maybe."}
    scripted.reply = CALL  # the same text without tools offered: text, as before tool calling existed
    plain = chat(client, tools=None)["choices"][0]
    assert plain["message"] == {"role": "assistant", "content": CALL} and plain["finish_reason"] == "stop"


def test_a_streamed_reply_sends_content_then_its_calls_whole(served: tuple[Scripted, TestClient]) -> None:
    scripted, client = served
    scripted.reply, scripted.piece = f"Checking.\n{CALL}\n{CALL}", 3  # a tag cut across chunks, two calls
    chunks = events(client)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == "Checking.\n"
    assert not any("<" in (d.get("content") or "") for d in deltas)  # no piece of a tag went out as content
    calls = [call for d in deltas for call in d.get("tool_calls") or []]
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "get_weather"), (1, "get_weather")]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]] == ["tool_calls"]
    assert all("tool_calls" in d for d in deltas[-1:]) and not any("tool_calls" in d for d in deltas[:-1])
    for chunk in chunks:
        openai.types.chat.ChatCompletionChunk.model_validate(chunk)


def test_a_call_cut_by_the_token_limit_is_content(served: tuple[Scripted, TestClient]) -> None:
    """`length` in the middle of a call's JSON: no call can be read, so the reply is its text, unary or streamed."""
    scripted, client = served
    scripted.reply, scripted.finish = CALL[:30], FinishReason.LENGTH
    choice = chat(client, max_tokens=30)["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == (CALL[:30], "length")
    deltas = [c["choices"][0] for c in events(client, max_tokens=30)]
    assert "".join(d["delta"].get("content") or "" for d in deltas) == CALL[:30]
    assert deltas[-1]["finish_reason"] == "length"


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
FORCED_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time"}},
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(params=["hermes", None], ids=["parser", "no-parser"])
def forcing(request: pytest.FixtureRequest) -> Iterator[tuple[Scripted, TestClient]]:
    """A forced call needs no parser: its reply's grammar makes it JSON (wave 59; a 400 before)."""
    scripted = Scripted()
    app = create_app(scripted, ApiSettings("m", Defaults(), 60.0, tool_call_parser=request.param))  # type: ignore[arg-type]
    with TestClient(app) as client:
        yield scripted, client


@pytest.mark.parametrize(
    ("tool_choice", "reply", "schema", "finish"),
    [
        (NAMED, '{"city": "Paris"}', WEATHER, "stop"),  # OpenAI's: a named function's call ends "stop"
        (
            "required",
            '[{"name": "get_weather", "parameters": {"city": "Paris"}}]',
            {
                "type": "array",
                "minItems": 1,
                "items": {
                    "anyOf": [
                        {
                            "type": "object",
                            "properties": {"name": {"enum": [name]}, "parameters": parameters},
                            "required": ["name", "parameters"],
                        }
                        for name, parameters in (
                            ("get_weather", WEATHER),
                            ("get_time", {"type": "object", "properties": {}}),
                        )
                    ]
                },
            },
            "tool_calls",
        ),
    ],
    ids=["named", "required"],
)
def test_a_forced_call_is_the_replys_structured_output_read_as_a_call(
    forcing: tuple[Scripted, TestClient], tool_choice: Any, reply: str, schema: dict[str, Any], finish: str
) -> None:
    scripted, client = forcing
    scripted.reply = reply
    body = chat(client, tools=FORCED_TOOLS, tool_choice=tool_choice)
    constraint = scripted.params[0].constraint
    assert constraint.kind == ConstraintKind.JSON and json.loads(constraint.spec) == schema
    assert json.loads(scripted.prompts[0])["tools"] == FORCED_TOOLS  # rendered, with or without a parser
    [choice] = body["choices"]
    assert choice["finish_reason"] == finish and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    openai.types.chat.ChatCompletion.model_validate(body)
    chunks = events(client, tools=FORCED_TOOLS, tool_choice=tool_choice)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert not "".join(d.get("content") or "" for d in deltas)  # the JSON went out as the call, not as text
    [streamed] = [call for d in deltas for call in d.get("tool_calls") or []]
    assert streamed["function"] == call["function"] and chunks[-1]["choices"][0]["finish_reason"] == finish


def test_a_forced_reply_cut_mid_json_is_content(forcing: tuple[Scripted, TestClient]) -> None:
    scripted, client = forcing
    scripted.reply, scripted.finish = '{"city": "Pa', FinishReason.LENGTH
    choice = chat(client, tools=FORCED_TOOLS, tool_choice=NAMED, max_tokens=5)["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": '{"city": "Pa'} and choice["finish_reason"] == "length"


@pytest.mark.parametrize("tool_choice", [NAMED, "required"])
def test_a_forced_call_that_ran_out_of_tokens_keeps_length(forcing: tuple[Scripted, TestClient], tool_choice) -> None:
    """Whole JSON at the very last token: a call, but the reason stays the generation's (vLLM's; found by review)."""
    scripted, client = forcing
    scripted.finish = FinishReason.LENGTH
    scripted.reply = '{"city": "Paris"}' if tool_choice == NAMED else '[{"name": "get_time", "parameters": {}}]'
    choice = chat(client, tools=FORCED_TOOLS, tool_choice=tool_choice)["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["tool_calls"]
    assert events(client, tools=FORCED_TOOLS, tool_choice=tool_choice)[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"tool_choice": "required"}, "send the tools it may call"),
        ({"tools": FORCED_TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope', not one"),
        ({"tools": FORCED_TOOLS, "tool_choice": {"type": "function"}}, "a named function is"),
        (
            {"tools": FORCED_TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "send no other",
        ),
    ],
)
def test_a_forced_call_that_cannot_be_made_is_a_400(
    forcing: tuple[Scripted, TestClient], extra: dict[str, Any], fragment: str
) -> None:
    _, client = forcing
    response = client.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "tool_choice" and fragment in error["message"], error


@pytest.mark.parametrize("parameters", ["object", ["a"], True])
def test_a_tool_whose_parameters_are_no_schema_object_is_a_400(
    forcing: tuple[Scripted, TestClient], parameters
) -> None:
    """Forced, such a tool's parameters became the grammar: a 500 (found by review)."""
    _, client = forcing
    tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
    body = {"model": "m", "messages": MESSAGES, "tools": tools, "tool_choice": "required"}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "tools", response.text

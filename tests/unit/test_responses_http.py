"""OpenAI's Responses API (`/v1/responses`) end to end over a scripted orchestrator, read by the official `openai`
client: the request as the chat completion it becomes, the reply as output items and as OpenAI's stream events."""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from starlette.testclient import TestClient

from calispec_core.access import Quota, QuotaBook
from calispec_core.errors import Unavailable
from calispec_core.generation import ConstraintKind, Defaults, FinishReason, TokenLogprob
from coordinator.engine import Chunk
from coordinator.openai_api import ApiSettings, create_app
from tests.unit.test_tool_calls_http import CALL, Scripted

TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
# the SDK's event types by their `type` (its union is discriminated by a marker pydantic does not read)
EVENT_TYPES = {
    kind.model_fields["type"].annotation.__args__[0]: kind
    for kind in typing.get_args(typing.get_args(openai.types.responses.ResponseStreamEvent)[0])
}


@pytest.fixture
def served() -> Iterator[tuple[Scripted, TestClient, openai.OpenAI]]:
    scripted = Scripted()
    app = create_app(scripted, ApiSettings("m", Defaults(), 60.0, tool_call_parser="hermes"))  # type: ignore[arg-type]
    with TestClient(app) as client:
        yield scripted, client, openai.OpenAI(base_url="http://testserver/v1", api_key="k", http_client=client)


def blocks(client: TestClient, **body: Any) -> list[str]:
    """A streamed Response's server-sent blocks, as sent: events and keep-alive comments."""
    with client.stream("POST", "/v1/responses", json={"model": "m", "stream": True, **body}) as response:
        assert response.status_code == 200, response.read()
        return "".join(response.iter_text()).strip().split("\n\n")


def events(client: TestClient, **body: Any) -> list[dict[str, Any]]:
    """A streamed Response's events, each checked: its `event:` line names its type, the SDK's types read it."""
    found = []
    for block in blocks(client, **body):
        if block == ": keep-alive":
            continue
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        EVENT_TYPES[event["type"]].model_validate(event)
        found.append(event)
    assert [e["sequence_number"] for e in found] == list(range(len(found)))
    return found


def refusal(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/responses", json={"model": "m", "input": "Hi", **body})
    assert response.status_code == 400, response.text
    return response.json()["error"]


def test_a_text_input_is_a_user_message_after_the_instructions(served) -> None:
    scripted, _, oai = served
    scripted.reply = "Hello there, friend."
    done = oai.responses.create(model="m", input="Hi", instructions="Be brief.", max_output_tokens=50)
    sent = json.loads(scripted.prompts[0])["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [("system", "Be brief."), ("user", "Hi")]
    assert scripted.params[0].max_new_tokens == 50
    assert done.output_text == "Hello there, friend." and done.status == "completed" and done.store is False
    [message] = done.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert done.id.startswith("resp_") and done.instructions == "Be brief." and done.max_output_tokens == 50
    assert done.usage is not None and (done.usage.input_tokens, done.usage.output_tokens) == (7, 20)
    assert done.usage.total_tokens == 27


def test_items_become_the_conversation_chat_renders(served) -> None:
    """Messages with typed parts, the assistant's earlier output sent back, its calls and their results."""
    scripted, _, oai = served
    scripted.reply = "Sunny."
    oai.responses.create(
        model="m",
        tools=TOOLS,  # type: ignore[list-item]
        input=[
            {"role": "developer", "content": "Answer in one word."},
            {"role": "user", "content": [{"type": "input_text", "text": t} for t in ("Weather", "?")]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
        ],
    )  # fmt: skip
    rendered = json.loads(scripted.prompts[0])
    assert rendered["tools"] == CHAT_TOOLS
    system, user, assistant, tool = rendered["messages"]
    assert (system["role"], system["content"]) == ("system", "Answer in one word.")
    assert user["content"] == "Weather\n?" and assistant["content"] == "Checking."
    [call] = assistant["tool_calls"]  # the call joined the assistant's message that came just before it
    assert call["function"]["name"] == "get_weather" and call["id"] == "c1"
    assert (tool["role"], tool["tool_call_id"], tool["content"]) == ("tool", "c1", "18 C")


def test_a_reply_cut_by_its_token_limit_is_incomplete(served) -> None:
    scripted, client, oai = served
    scripted.reply, scripted.finish = "It was a dark", FinishReason.LENGTH
    done = oai.responses.create(model="m", input="Tell a story", max_output_tokens=13)
    assert done.status == "incomplete" and done.incomplete_details is not None
    assert done.incomplete_details.reason == "max_output_tokens" and done.output[0].status == "incomplete"
    last = events(client, input="Tell a story", max_output_tokens=13)[-1]
    assert last["type"] == "response.incomplete" and last["response"]["status"] == "incomplete"


def test_a_stream_sends_openais_events_and_the_unary_response(served) -> None:
    scripted, client, oai = served
    scripted.reply, scripted.piece = "Hello there, friend.", 4
    unary = oai.responses.create(model="m", input="Hi")
    found = events(client, input="Hi")
    kinds = [e["type"] for e in found]
    deltas = kinds.count("response.output_text.delta")
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        *["response.output_text.delta"] * deltas, "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert deltas == 5 and "".join(e["delta"] for e in found if "delta" in e) == unary.output_text
    assert found[0]["response"]["status"] == "in_progress" and found[0]["response"]["output"] == []
    final = found[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == unary.output_text and final["usage"] == unary.usage.model_dump(
        exclude_none=True
    )
    with oai.responses.stream(model="m", input="Hi") as stream:  # the SDK's helper checks the events' order
        assert stream.get_final_response().output_text == unary.output_text


def test_tool_calls_are_function_call_items(served) -> None:
    scripted, client, oai = served
    scripted.reply = f"Checking.\n{CALL}"
    done = oai.responses.create(model="m", input="Weather in Paris?", tools=TOOLS)  # type: ignore[arg-type]
    message, call = done.output
    assert message.type == "message" and message.content[0].text == "Checking.\n"  # type: ignore[union-attr]
    assert call.type == "function_call" and call.id.startswith("fc_") and call.call_id  # type: ignore[union-attr]
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}')  # type: ignore[union-attr]
    found = events(client, input="Weather in Paris?", tools=TOOLS)
    text = "".join(e["delta"] for e in found if e["type"] == "response.output_text.delta")
    assert text == "Checking.\n"  # nothing of the call's tags went out as text
    [done_call] = [e for e in found if e["type"] == "response.function_call_arguments.done"]
    assert (done_call["output_index"], done_call["arguments"]) == (1, '{"city": "Paris"}')
    with oai.responses.stream(model="m", input="Weather in Paris?", tools=TOOLS) as stream:  # type: ignore[arg-type]
        assert [item.type for item in stream.get_final_response().output] == ["message", "function_call"]
    scripted.piece = 3  # every chunk sends something while the call's text is held back (a silent stream times out)
    sent = blocks(client, input="Weather in Paris?", tools=TOOLS)
    assert sent.count(": keep-alive") >= len(CALL) // 3 - 2 and len(sent) > len(scripted.reply) // 3


def test_a_forced_call_is_the_only_item(served) -> None:
    scripted, client, oai = served
    scripted.reply = '{"city": "Paris"}'
    choice = {"type": "function", "name": "get_weather"}
    done = oai.responses.create(model="m", input="Weather?", tools=TOOLS, tool_choice=choice)  # type: ignore[arg-type]
    assert scripted.params[0].constraint.kind == ConstraintKind.JSON
    [call] = done.output
    assert call.type == "function_call" and call.arguments == '{"city": "Paris"}'  # type: ignore[union-attr]
    kinds = [e["type"] for e in events(client, input="Weather?", tools=TOOLS, tool_choice=choice)]
    assert "response.output_text.delta" not in kinds and kinds[-1] == "response.completed"


def test_text_format_is_the_structured_output(served) -> None:
    scripted, _, oai = served
    scripted.reply = '{"ok": true}'
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    form = {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}
    done = oai.responses.create(model="m", input="Fine?", text=form)  # type: ignore[arg-type]
    constraint = scripted.params[0].constraint
    assert constraint.kind == ConstraintKind.JSON and json.loads(constraint.spec) == schema
    assert done.output_text == '{"ok": true}' and done.text.format.type == "json_schema"  # type: ignore[union-attr]


def test_logprobs_are_included_when_asked(served) -> None:
    scripted, _, oai = served
    scripted.reply = "Hi"
    oai.responses.create(model="m", input="Hi", include=["message.output_text.logprobs"], top_logprobs=3)
    oai.responses.create(model="m", input="Hi")
    assert [p.logprobs for p in scripted.params] == [3, None]


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "nothing is stored"),
        ({"conversation": "conv_1"}, "conversation", "nothing is stored"),
        ({"input": []}, "input", "at least one item"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type", "'reasoning' are not supported"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id", "needs call_id"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id", "the call_id it answers"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content",
            "'input_image'",
        ),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role", "robot"),
        ({"instructions": "Be brief.", "input": [{"role": "user"}]}, "input[0].content", "must be a string"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]", "'web_search' are not supported"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice", '{"type": "function", "name": ...}'),
        ({"max_output_tokens": 0}, "max_output_tokens", "must be in [1, "),
        ({"text": {"format": {"type": "yaml"}}}, "text.format", "yaml"),
        ({"top_logprobs": 21}, "top_logprobs", "must be in [0, 20]"),
        ({"truncation": "auto"}, "truncation", 'send "disabled"'),
        ({"background": True}, "background", "send false"),
        ({"max_tool_calls": 3}, "max_tool_calls", "max_tool_calls is not supported: leave it out"),
        ({"temperature": -1}, "temperature", "temperature"),
    ],
)
def test_what_cannot_be_served_is_a_400_naming_the_field(served, body: dict, param: str, fragment: str) -> None:
    _, client, _ = served
    error = refusal(client, **body)
    assert error["param"] == param and fragment in error["message"], error


def test_a_call_in_the_input_without_a_parser_names_its_item() -> None:
    """Rendering refuses calls where none are parsed: the refusal names the input item, not chat's message."""
    app = create_app(Scripted(), ApiSettings("m", Defaults(), 60.0))  # type: ignore[arg-type]
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    with TestClient(app) as client:
        response = client.post("/v1/responses", json={"model": "m", "instructions": "x", "input": [call]})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "input[0]"  # the item is the call


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"instructions": "\ud800", "input": "Hi"}, "instructions"),  # the field is the message's text
        ({"input": "\ud800"}, "input"),
        ({"input": [{"role": "user", "content": "Hi"}, {"role": "user", "content": "x\ud800"}]}, "input[1].content"),
    ],
)
def test_refusals_of_the_messages_name_the_responses_fields(served, body: dict, param: str) -> None:
    """Found by review: `instructions.content` and `input.content`, and messages[1] in the text."""
    _, client, _ = served
    sent = json.dumps({"model": "m", **body})  # ASCII escapes: the lone surrogate reaches the server
    response = client.post("/v1/responses", content=sent, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "messages" not in error["message"], error


USER = {"role": "user", "content": "Weather?"}


def call(call_id: str, arguments: str = "{}") -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": arguments}


@pytest.mark.parametrize(
    ("parser", "items", "param", "fragment"),
    [
        (None, [USER, {"role": "assistant", "content": "x"}, call("c1")], "input[2]", "tool"),
        ("hermes", [USER, call("c1"), call("c2", "not json")], "input[2].arguments", "input[2].arguments"),
        ("hermes", [USER, call("c1"), {"type": "function_call_output", "call_id": "c1", "output": {"a": 1}}],
         "input[2].output", "input[2].output"),
        (None, [USER, {"type": "function_call_output", "call_id": "c1", "output": "18 C"}], "input[1]", "input[1]"),
    ],
)  # fmt: skip
def test_refusals_of_calls_and_their_outputs_name_their_items(
    parser: str | None, items: list, param: str, fragment: str
) -> None:
    """A call merged into the message before it, and a tool message's fields, are named as the items that made them
    (found by the second review: `input[1].tool_calls`, `input[2].content`, `input[1].role`)."""
    app = create_app(Scripted(), ApiSettings("m", Defaults(), 60.0, tool_call_parser=parser))  # type: ignore[arg-type]
    with TestClient(app) as client:
        response = client.post("/v1/responses", json={"model": "m", "input": items})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and fragment in error["message"] and "messages" not in error["message"], error


def test_a_json_schema_format_needs_a_name(served) -> None:
    """OpenAI's and vLLM's rule; it was served, echoing a format the SDK's types refuse (found by review)."""
    _, client, _ = served
    error = refusal(client, text={"format": {"type": "json_schema", "schema": {"type": "object"}}})
    assert error["param"] == "text.format.name", error


def test_a_malformed_request_costs_no_quota(served) -> None:
    """Refused before admission, as chat's schema refusals are: a bad item spent the caller's only request."""
    scripted = Scripted()
    scripted.reply = "Hi"
    quotas = QuotaBook(Quota(requests_per_minute=1, burst=1))
    app = create_app(scripted, ApiSettings("m", Defaults(), 60.0, quotas=quotas))  # type: ignore[arg-type]
    with TestClient(app) as client:
        bad = client.post("/v1/responses", json={"model": "m", "input": [{"type": "reasoning"}]})
        good = client.post("/v1/responses", json={"model": "m", "input": "Hi"})
    assert (bad.status_code, good.status_code) == (400, 200), good.text


class Scored(Scripted):
    """Its chunks carry a log-probability per token."""

    def __init__(self) -> None:
        super().__init__()
        self.tokenizer.decode = lambda ids, **kwargs: "t"  # type: ignore[attr-defined]

    def generate(self, *args: Any) -> Iterator[Chunk]:
        for chunk in super().generate(*args):
            chunk.logprobs = [TokenLogprob(-0.5, (1,), (-0.5,)) for _ in chunk.token_ids]
            yield chunk


def test_streamed_log_probabilities_go_with_their_text() -> None:
    """Text held back (it may start a call) sends its entries with the delta that releases it: the deltas' entries
    are the message's (found by review: they were dropped from the deltas)."""
    scored = Scored()
    scored.reply, scored.piece = "It is sunny <tools> maybe.", 3
    app = create_app(scored, ApiSettings("m", Defaults(), 60.0, tool_call_parser="hermes"))  # type: ignore[arg-type]
    with TestClient(app) as client:
        found = events(client, input="Hi", tools=TOOLS, include=["message.output_text.logprobs"])
    deltas = [e for e in found if e["type"] == "response.output_text.delta"]
    [done] = [e for e in found if e["type"] == "response.output_text.done"]
    assert "".join(d["delta"] for d in deltas) == scored.reply and len(done["logprobs"]) == len(scored.reply)
    assert sum(len(d["logprobs"]) for d in deltas) == len(done["logprobs"])


class Failing(Scripted):
    """Its first chunk arrives, then its replica goes away."""

    def generate(self, *args: Any) -> Iterator[Chunk]:
        yield Chunk([1], "Hel", "r")
        raise Unavailable("the target replica went away")


def test_a_failure_mid_stream_is_an_error_event_last() -> None:
    app = create_app(Failing(), ApiSettings("m", Defaults(), 60.0))  # type: ignore[arg-type]
    with TestClient(app) as client:
        found = events(client, input="Hi")
    assert [e["type"] for e in found][-3:] == ["response.output_text.delta", "error", "response.failed"]
    assert (found[-2]["code"], found[-2]["message"]) == ("unavailable", "the target replica went away")
    failed = found[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["message"] == "the target replica went away"
    assert failed["output"][0]["content"][0]["text"] == "Hel"  # what was written before


class FailingAfterHeldText(Scored):
    """Text, then text held back (it may start a call), then its replica goes away."""

    def generate(self, *args: Any) -> Iterator[Chunk]:
        yield Chunk([1, 1], "Hi", "r", logprobs=[TokenLogprob(-0.5, (1,), (-0.5,))] * 2)
        yield Chunk([1, 1], "<tool", "r", logprobs=[TokenLogprob(-0.5, (1,), (-0.5,))] * 2)
        raise Unavailable("the target replica went away")


def test_a_failed_response_holds_the_log_probabilities_of_its_text_only() -> None:
    """Found by the second review: the held-back text's entries were in the failed Response's message."""
    app = create_app(FailingAfterHeldText(), ApiSettings("m", Defaults(), 60.0, tool_call_parser="hermes"))  # type: ignore[arg-type]
    with TestClient(app) as client:
        found = events(client, input="Hi", tools=TOOLS, include=["message.output_text.logprobs"])
    [text] = found[-1]["response"]["output"][0]["content"]
    assert (text["text"], len(text["logprobs"])) == ("Hi", 2), text

"""Tool calls read from a chat reply (coordinator/tool_calls.py) and their place in the HTTP API's answers."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calispec_core.generation import FinishReason
from coordinator.chat import ChatTurn, InvalidParam, render_chat
from coordinator.config import CoordinatorConfig
from coordinator.engine import Chunk
from coordinator.openai_api import ApiSettings, OpenAIApi, chat_delta
from coordinator.openai_generations import Outcome
from coordinator.openai_protocol import ChatCompletionRequest
from coordinator.tool_calls import START, ToolCallStream, parse_reply, template_tool_calls

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SECOND = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET", "note": "é"}}\n</tool_call>'


def named(reply_text: str) -> list[tuple[str, dict[str, object]]]:
    return [(c.name, json.loads(c.arguments)) for c in parse_reply(reply_text).calls]


def test_a_reply_without_calls_is_plain_content() -> None:
    reply = parse_reply("def add(a, b): return a + b")
    assert reply.content == "def add(a, b): return a + b" and reply.calls == ()


def test_calls_are_read_with_the_text_before_them_as_content() -> None:
    reply = parse_reply(f"Let me look.\n{CALL}\n{SECOND}")
    assert reply.content == "Let me look.\n"
    assert named(f"Let me look.\n{CALL}\n{SECOND}") == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"zone": "CET", "note": "é"}),
    ]
    assert '"é"' in reply.calls[1].arguments  # as vLLM: not escaped
    assert len({c.id for c in reply.calls}) == 2 and all(c.id.startswith("chatcmpl-tool-") for c in reply.calls)


def test_arguments_written_as_an_objects_text_are_that_object() -> None:
    assert named('<tool_call>{"name": "f", "arguments": "{\\"c\\": 1}"}</tool_call>') == [("f", {"c": 1})]


def test_a_reply_of_calls_alone_has_no_content_and_an_unclosed_last_call_counts() -> None:
    reply = parse_reply('<tool_call>\n{"name": "f", "arguments": {}}')  # the stop token ended it
    assert reply.content is None and [(c.name, c.arguments) for c in reply.calls] == [("f", "{}")]


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "f"}\n</tool_call>',  # no arguments
        '<tool_call>\n["f", {}]\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": "Paris"}\n</tool_call>',  # not an object: a client sends it back
        '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": null}\n</tool_call>',
        f"{CALL}\n<tool_call>\nthe model wandered off",
    ],
)
def test_a_block_that_is_no_call_leaves_the_whole_reply_as_content(text: str) -> None:
    """As vLLM's hermes parser: a reply it cannot read whole is the model's text, not half of its calls."""
    assert parse_reply(text).calls == ()
    assert parse_reply(text).content == text


def test_a_stream_never_sends_a_tags_start_as_content() -> None:
    stream = ToolCallStream()
    sent = [stream.feed(piece) for piece in ["Sure", ".\n<to", "ol_c", 'all>\n{"name": "f", ', '"arguments": {}}']]
    assert sent == ["Sure", ".\n", "", "", ""]
    rest, calls = stream.finish()
    assert rest == "" and [(c.name, c.arguments) for c in calls] == [("f", "{}")]


def test_a_stream_releases_what_only_looked_like_a_tag() -> None:
    stream = ToolCallStream()
    assert [stream.feed(p) for p in ["a <tool", "s> b <", ""]] == ["a ", "<tools> b ", ""]
    assert stream.finish() == ("<", ())


def test_a_stream_whose_call_cannot_be_read_sends_it_as_content_at_the_end() -> None:
    stream = ToolCallStream()
    assert stream.feed("x <tool_call>{oops") == "x "
    assert stream.feed(" more") == ""
    assert stream.finish() == ("<tool_call>{oops more", ())


@given(
    st.lists(st.sampled_from(["Sure. ", CALL, "\n", SECOND, "<tool", "_call>", "{", "}", "text"]), max_size=6),
    st.data(),
)
def test_a_stream_cut_anywhere_says_what_the_whole_reply_says(parts: list[str], data: st.DataObject) -> None:
    text = "".join(parts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    stream = ToolCallStream()
    content = "".join(stream.feed(p) for p in pieces)
    rest, calls = stream.finish()
    whole = parse_reply(text)
    assert content + rest == ((whole.content or "") if whole.calls else text)
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole.calls]
    assert START not in content or not whole.calls


def test_an_assistants_calls_reach_the_template_with_object_arguments() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]
    assert template_tool_calls(calls, "m") == [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
    ]
    assert template_tool_calls([{"function": {"name": "f", "arguments": " "}}], "m")[0]["function"]["arguments"] == {}
    for bad in ('"x"', "[1]", "{oops"):
        with pytest.raises(ValueError, match=r"m\[0\]\.function\.arguments must be a JSON object"):
            template_tool_calls([{"function": {"name": "f", "arguments": bad}}], "m")


class ToolTemplate:
    chat_template, bos_token = "t", None

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, continue_final_message, tools=None):
        return json.dumps({"messages": messages, "tools": tools})


def test_tool_turns_and_tools_reach_the_template_only_where_calls_are_parsed() -> None:
    calls = ({"type": "function", "function": {"name": "f", "arguments": {}}},)
    turns = [ChatTurn("user", "hi"), ChatTurn("assistant", "", calls), ChatTurn("tool", "4", tool_call_id="c1")]
    tools = [{"type": "function", "function": {"name": "f"}}]
    rendered = json.loads(render_chat(ToolTemplate(), turns, tools=tools, tool_turns=True))  # type: ignore[arg-type]
    assert rendered["tools"] == tools
    assert rendered["messages"][1]["tool_calls"] == list(calls)
    assert rendered["messages"][2] == {"role": "tool", "content": "4", "tool_call_id": "c1"}
    with pytest.raises(InvalidParam, match="need the HTTP chat API") as info:
        render_chat(ToolTemplate(), turns[:2])  # type: ignore[arg-type]
    assert info.value.param == "messages[1].tool_calls"
    with pytest.raises(InvalidParam, match="cannot continue a final message that holds tool calls") as info:
        render_chat(ToolTemplate(), turns[:2], False, True, tool_turns=True)  # type: ignore[arg-type]
    assert info.value.param == "messages[1].tool_calls"  # the template writes calls after the content: cut


@pytest.mark.parametrize(
    ("message", "tool_turns", "fragment"),
    [
        ({"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}, True,
         "only an assistant message has tool calls"),
        ({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}, False,
         "need the HTTP chat API"),  # refused for want of a parser before its arguments are read
        ({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}, True,
         "must be a JSON object"),
    ],
)  # fmt: skip
def test_calls_in_a_conversation_are_refused_where_they_cannot_be_rendered(
    message: dict[str, object], tool_turns: bool, fragment: str
) -> None:
    from coordinator.openai_tokenizer import render_messages

    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [message]})
    with pytest.raises(InvalidParam, match=fragment) as info:
        render_messages(ToolTemplate(), req, req.messages, tool_turns)  # type: ignore[arg-type]
    assert info.value.param == "messages[0].tool_calls"


def chunk(text: str, finish: FinishReason | None = None) -> Chunk:
    return Chunk([1] * len(text), text, "r", finish)


def test_streamed_chunks_hold_back_calls_and_end_with_them() -> None:
    calls = ToolCallStream()
    first, finish = chat_delta(chunk("Sure.\n<tool_"), calls)
    assert (first.content, first.tool_calls, finish) == ("Sure.\n", None, None)
    last, finish = chat_delta(
        chunk('call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', FinishReason.EOS), calls
    )
    assert finish == "tool_calls" and last.content is None
    assert last.tool_calls is not None and [
        (c.index, c.function.name, c.function.arguments) for c in last.tool_calls
    ] == [(0, "f", '{"a": 1}')]
    assert json.loads(last.model_dump_json())["tool_calls"][0]["type"] == "function"


def test_streamed_chunks_without_calls_are_unchanged_and_carry_no_tool_calls_key() -> None:
    delta, finish = chat_delta(chunk("abc", FinishReason.LENGTH), ToolCallStream())
    assert (delta.content, finish) == ("abc", "length")
    assert "tool_calls" not in json.loads(delta.model_dump_json())
    plain, _ = chat_delta(chunk(CALL, FinishReason.EOS), None)  # tools not sent: the text is the text
    assert plain.content == CALL and plain.tool_calls is None


def test_a_unary_choice_with_calls_ends_tool_calls() -> None:
    api = OpenAIApi(SimpleNamespace(tokenizer=None), ApiSettings("m", None, 1.0, tool_call_parser="hermes"))  # type: ignore[arg-type]
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "?"}], "tools": tools}
    )
    outcome = Outcome(CALL, chunk("", FinishReason.EOS), [1])
    choice = api.chat_choice(req, 0, outcome)
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls is not None and choice.message.tool_calls[0].function.name == "get_weather"
    plain = api.chat_choice(req.model_copy(update={"tool_choice": "none"}), 0, outcome)
    assert (plain.message.content, plain.finish_reason) == (CALL, "stop")
    assert "tool_calls" not in json.loads(plain.model_dump_json())["message"]


def test_up_and_the_coordinator_take_the_parser_and_refuse_others(tmp_path: Path) -> None:
    from calispec_tools.cli import build_parser, stack_config
    from calispec_tools.stack import LocalStack
    from coordinator import __main__ as coordinator_cli
    from coordinator.openai_api import api_settings

    base = ["--draft-addr", "d:1", "--target-addr", "t:1", "--tokenizer", "x"]
    assert coordinator_cli.parse_config(base)[0].tool_call_parser is None  # off by default, as vLLM's
    config = coordinator_cli.parse_config([*base, "--tool-call-parser", "hermes"])[0]
    assert api_settings(config, None, None).tool_call_parser == "hermes"
    with pytest.raises(SystemExit):
        coordinator_cli.parse_config([*base, "--tool-call-parser", "mistral"])
    with pytest.raises(ValueError, match="tool_call_parser"):
        CoordinatorConfig("127.0.0.1:1", ("127.0.0.1:2",), tmp_path, tool_call_parser="mistral")
    dirs = ["--draft", str(tmp_path / "draft"), "--target", str(tmp_path / "target")]
    for flags in ([], ["--tool-call-parser", "hermes"]):
        up = build_parser().parse_args(["up", *dirs, *flags])
        args = LocalStack(stack_config(up, (0, 0, 0, 0))).coordinator_args("127.0.0.1:2", ["127.0.0.1:3"])
        assert args[args.index("--tool-call-parser") :][:2] == flags if flags else "--tool-call-parser" not in args

"""Tool calls in a chat reply, as vLLM's `hermes` tool parser reads them (no gRPC here).

Models trained on the Hermes format (Qwen2.5 and its coder models among them) write each call as a JSON object
between `<tool_call>` and `</tool_call>`: `{"name": ..., "arguments": {...}}`. A reply is parsed whole: the text
before the first `<tool_call>` is the message's content (None when empty), each block one call (the last one may
be unclosed: the reply ran into its stop token), and a block that is not such an object leaves the whole reply as
plain content with no calls, as vLLM does. A stream holds back what may be the start of a call, so that a client
never receives half a tag as content, and sends the calls at the end of the choice (`ToolCallStream`).

A forced call (`tool_choice` "required" or a named function) needs no parser: the reply's structured output makes it
JSON of a known shape (`forced_call_schema`), read by `parse_forced`.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal

START, END = "<tool_call>", "</tool_call>"
_BLOCKS = re.compile(rf"{START}(.*?){END}|{START}(.*)", re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    id: str  # "chatcmpl-tool-<hex>", as vLLM names them
    name: str
    arguments: str  # a JSON object's text, as OpenAI's API carries it


@dataclass(frozen=True)
class ParsedReply:
    content: str | None  # the text outside the calls (None: nothing but calls)
    calls: tuple[ParsedCall, ...]  # empty: a plain reply


def parse_reply(text: str) -> ParsedReply:
    """`text` as content and calls (module doc); a reply whose blocks are not all calls is plain content."""
    if START not in text:
        return ParsedReply(text, ())
    try:
        calls = tuple(_call(first or rest) for first, rest in _BLOCKS.findall(text))
    except ValueError:  # json.JSONDecodeError included: the model wrote something else
        return ParsedReply(text, ())
    content = text[: text.index(START)]
    return ParsedReply(content or None, calls)


def _call(block: str) -> ParsedCall:
    """One block's call; ValueError unless it names a function and its arguments are an object (or an object's
    JSON text): OpenAI's clients read `arguments` as an object's text and send it back so."""
    obj = json.loads(block)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("not a call")
    arguments = obj.get("arguments")
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        raise ValueError("arguments are not an object")
    return _parsed(obj["name"], arguments)


class ToolCallStream:
    """One streamed choice's text, fed as it arrives: `feed` returns the content that may go out now (all of it
    before the first `<tool_call>`, less a tail that could be the start of the tag), `finish` the rest and the
    calls, parsed from the whole reply once it has ended."""

    def __init__(self) -> None:
        self._text = ""  # the whole reply so far
        self._sent = 0  # how much of it went out as content
        self._in_call = False

    def feed(self, text: str) -> str:
        self._text += text
        if self._in_call:
            return ""
        start = self._text.find(START, self._sent)
        if start >= 0:
            self._in_call = True
            return self._send_to(start)
        return self._send_to(len(self._text) - _held_back(self._text))

    def finish(self) -> tuple[str, tuple[ParsedCall, ...]]:
        """(content not sent yet, the calls): everything held back when the reply holds no calls."""
        reply = parse_reply(self._text)
        if not reply.calls:
            return self._send_to(len(self._text)), ()
        return "", reply.calls

    @staticmethod
    def finish_reason(ended: str) -> Literal["tool_calls"]:
        """A reply with calls ends "tool_calls", also when the token limit cut it after a whole call (as vLLM's)."""
        return "tool_calls"

    def _send_to(self, end: int) -> str:
        out, self._sent = self._text[self._sent : end], max(end, self._sent)
        return out


def _held_back(text: str) -> int:
    """How many characters at the end of `text` could begin `<tool_call>` (0: none)."""
    for size in range(min(len(START) - 1, len(text)), 0, -1):
        if START.startswith(text[-size:]):
            return size
    return 0


def template_tool_calls(calls: list[Any], where: str) -> list[dict[str, Any]]:
    """An assistant message's tool calls (OpenAI's form: `arguments` a JSON object's text) as chat templates read
    them (`arguments` an object: Hermes templates write it with `tojson`), as vLLM passes them. ValueError names
    the call whose arguments are not a JSON object."""
    out = []
    for i, call in enumerate(calls):
        function = call["function"]
        try:  # an empty text is no arguments, as vLLM takes it
            arguments = json.loads(function["arguments"]) if function["arguments"].strip() else {}
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise ValueError(f"{where}[{i}].function.arguments must be a JSON object's text")
        out.append({"id": call.get("id"), "type": "function", "function": {**function, "arguments": arguments}})
    return out


# A forced call (tool_choice "required" or a named function): the reply's grammar (structured output) makes it JSON of
# a known shape, which becomes the calls; no tags to find, so no parser is needed (as vLLM's).
ToolChoice = str | dict[str, Any]  # "required", or {"type": "function", "function": {"name": ...}}


def forced_call_schema(tools: list[dict[str, Any]], tool_choice: ToolChoice) -> dict[str, Any]:
    """The JSON schema a forced reply follows, as vLLM's: a named function's parameters; for "required" a non-empty
    array of {"name": ..., "parameters": {...}} objects, each naming one of the tools."""
    if isinstance(tool_choice, dict):
        return _parameters(next(t for t in tools if t["function"]["name"] == tool_choice["function"]["name"]))
    calls = [
        {
            "type": "object",
            "properties": {"name": {"enum": [tool["function"]["name"]]}, "parameters": _parameters(tool)},
            "required": ["name", "parameters"],
        }
        for tool in tools
    ]
    return {"type": "array", "minItems": 1, "items": {"anyOf": calls}}


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    return tool["function"].get("parameters") or {"type": "object", "properties": {}}


def parse_forced(text: str, tool_choice: ToolChoice) -> tuple[ParsedCall, ...]:
    """A forced reply's calls; () when it is not the JSON its grammar promised (the token limit cut it)."""
    try:
        value = json.loads(text)
    except ValueError:
        return ()
    if isinstance(tool_choice, dict):
        return (_parsed(tool_choice["function"]["name"], value),) if isinstance(value, dict) else ()
    if not isinstance(value, list) or not all(_is_call(call) for call in value):
        return ()
    return tuple(_parsed(call["name"], call["parameters"]) for call in value)


def _is_call(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("name"), str) and isinstance(value.get("parameters"), dict)


def _parsed(name: str, arguments: dict[str, Any]) -> ParsedCall:
    return ParsedCall(f"chatcmpl-tool-{uuid.uuid4().hex}", name, json.dumps(arguments, ensure_ascii=False))


class ForcedCallStream:
    """A streamed forced reply: held whole (its JSON is the calls), then its calls, or its text when it is not."""

    def __init__(self, tool_choice: ToolChoice) -> None:
        self.tool_choice = tool_choice
        self._text = ""

    def feed(self, text: str) -> str:
        self._text += text
        return ""

    def finish(self) -> tuple[str, tuple[ParsedCall, ...]]:
        calls = parse_forced(self._text, self.tool_choice)
        return ("", calls) if calls else (self._text, ())

    def finish_reason(self, ended: str) -> Literal["stop", "length", "tool_calls"]:
        """A forced reply read as calls: OpenAI's "stop" for a named function's, "tool_calls" for "required" (as
        vLLM's); "length" stays (`ended`: the generation's own reason)."""
        if ended == "length":
            return "length"
        return "stop" if isinstance(self.tool_choice, dict) else "tool_calls"

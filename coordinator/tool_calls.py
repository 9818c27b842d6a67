"""Tool calls in a chat reply, as vLLM's `hermes` tool parser reads them (no gRPC here).

Models trained on the Hermes format (Qwen2.5 and its coder models among them) write each call as a JSON object
between `<tool_call>` and `</tool_call>`: `{"name": ..., "arguments": {...}}`. A reply is parsed whole: the text
before the first `<tool_call>` is the message's content (None when empty), each block one call (the last one may
be unclosed: the reply ran into its stop token), and a block that is not such an object leaves the whole reply as
plain content with no calls, as vLLM does. A stream holds back what may be the start of a call, so that a client
never receives half a tag as content, and sends the calls at the end of the choice (`ToolCallStream`).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

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
    return ParsedCall(f"chatcmpl-tool-{uuid.uuid4().hex}", obj["name"], json.dumps(arguments, ensure_ascii=False))


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

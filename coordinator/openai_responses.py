"""OpenAI's Responses API (`POST /v1/responses`, what OpenAI's Agents SDK and newer clients call) over the chat path.

A request becomes a chat completion's (`ResponsesRequest.chat_request`): `instructions` a system message first,
`input` the messages (a string is one user message; `function_call` and `function_call_output` items are an
assistant's tool calls and the tool messages answering them), `max_output_tokens` the token limit, `text.format` the
response format, the flat function tools chat's nested ones. The reply becomes the Response's output items: a
`message` with one `output_text` part, then a `function_call` item per tool call (`output_items`); a stream sends
OpenAI's semantic events (`ResponseEvents`). Nothing is stored (vLLM's default): `previous_response_id` and
`conversation` are refused (send the conversation in `input`), and every Response says `store: false`.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from coordinator.chat import InvalidParam
from coordinator.openai_protocol import (
    NOT_IMPLEMENTED,
    ChatCompletionRequest,
    ChatLogprobs,
    ChatTokenLogprob,
    OpenAIModel,
    ToolCall,
    Usage,
    invalid,
    noop_only,
    now,
    openai_param,
)

INCLUDE_LOGPROBS = "message.output_text.logprobs"
# fields a chat completion takes that a Responses request may send too, as they are (vLLM's sampling extensions and
# Calispec's speculation controls); the unimplemented ones go along so that chat's refusal names them
PASSED_THROUGH = frozenset({
    "seed", "top_k", "mode", "gamma", "tau", "lambda", "ignore_eos", "stop", "stop_token_ids", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "min_p", "min_tokens", "logit_bias", "allowed_token_ids", "bad_words",
    "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "chat_template_kwargs",
    *NOT_IMPLEMENTED,
})  # fmt: skip
# a chat field's name in a Responses request (the refusals of the chat request it became name what was sent)
RESPONSES_NAMES: dict[str, tuple[str, ...]] = {
    "max_completion_tokens": ("max_output_tokens",),
    "response_format": ("text", "format"),
}


def new_item_id(prefix: str) -> str:
    """OpenAI's form of a Response's and its items' ids (`resp_…`, `msg_…`, `fc_…`)."""
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesRequest(OpenAIModel):
    """A Responses API request. Fields of OpenAI's that change nothing here are accepted and echoed (`metadata`,
    `parallel_tool_calls`, `reasoning`: the served models do not reason apart) or ignored (`user`, `service_tier`,
    `prompt_cache_key`, `safety_identifier`); the ones that cannot be honoured are refused unless at their no-op."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)  # PASSED_THROUGH fields are extras

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    metadata: dict[str, str] | None = None
    reasoning: dict[str, Any] | None = None
    store: bool = True  # accepted; nothing is stored (every Response says store: false)
    user: str | None = None
    # OpenAI's fields that need what is not here: each at its no-op only
    previous_response_id: Any = None
    conversation: Any = None
    background: Any = None
    truncation: Any = None
    max_tool_calls: Any = None
    prompt: Any = None

    @field_validator("previous_response_id", "conversation", mode="before")
    @classmethod
    def _nothing_stored(cls, value: Any) -> Any:
        if value is not None:
            raise invalid("nothing is stored here: send the whole conversation in input")
        return value

    @field_validator("background")
    @classmethod
    def _in_the_foreground(cls, value: Any) -> Any:
        return noop_only(value, "background", (False,))

    @field_validator("truncation")
    @classmethod
    def _never_truncated(cls, value: Any) -> Any:
        return noop_only(value, "truncation", ("disabled",))  # "auto" would drop input to fit the context

    @field_validator("max_tool_calls", "prompt", mode="before")
    @classmethod
    def _not_implemented(cls, value: Any, info: ValidationInfo) -> Any:
        return noop_only(value, info.field_name or "", ())

    @field_validator("input")
    @classmethod
    def _some_input(cls, value: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        if isinstance(value, list) and not value:
            raise invalid("must hold at least one item")
        return value

    def wants_logprobs(self) -> bool:
        return INCLUDE_LOGPROBS in (self.include or ()) or bool(self.top_logprobs)

    def chat_request(self) -> ChatForm:
        """The chat completion this request asks for; its refusals name this request's fields (RequestValidationError,
        answered as any request's schema refusal is)."""
        messages, sources = chat_messages(self.instructions, self.input)
        chat: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stream": self.stream,
            "tools": [chat_tool(tool, i) for i, tool in enumerate(self.tools or ())] or None,
            "tool_choice": chat_tool_choice(self.tool_choice),
            "response_format": chat_response_format(self.text),
            "logprobs": self.wants_logprobs(),
            "top_logprobs": self.top_logprobs,
            **{key: value for key, value in (self.model_extra or {}).items() if key in PASSED_THROUGH},
        }
        try:
            return ChatForm(ResponsesChat.model_validate(chat), sources)
        except ValidationError as exc:
            raise RequestValidationError([renamed(error, sources) for error in exc.errors()]) from None


class ResponsesChat(ChatCompletionRequest):
    """The chat completion a Responses request became: the context's refusals name the Responses request's fields."""

    prompt_field: ClassVar[str] = "input"

    def token_limit_field(self) -> str:
        return "max_output_tokens"


@dataclass(frozen=True)
class ChatForm:
    """A Responses request as a chat completion, and where each of its messages came from."""

    chat: ChatCompletionRequest
    sources: Sequence[MessageSource]

    def refusal(self, exc: InvalidParam) -> InvalidParam:
        """A chat refusal (`messages[2].tool_calls[1].function.arguments`, in its param and its message) as the
        Responses request names the field (`input[4].arguments`); `messages` as a whole is the input."""
        if exc.param == "messages":
            return InvalidParam(str(exc), "input")
        message = str(exc)  # it may name a place under the param (one call of the message's calls): that is the param
        deeper = next((m for m in CHAT_PLACE.finditer(message) if m[0].startswith(exc.param)), None)
        param = self._renamed(deeper) if deeper is not None else CHAT_PLACE.sub(self._renamed, exc.param)
        return InvalidParam(CHAT_PLACE.sub(self._renamed, message), param)

    def _renamed(self, match: re.Match[str]) -> str:
        index = int(match[1])
        if index >= len(self.sources):
            return match[0]
        rest = [int(i) if i else name for name, i in re.findall(r"\.(\w+)|\[(\d+)\]", match[2])]
        return openai_param(("body", *self.sources[index].place(rest))) or "input"


CHAT_PLACE = re.compile(r"messages\[(\d+)\]((?:\.\w+|\[\d+\])*)")  # a place in chat's messages, as refusals name it
TOOL_MESSAGE_FIELDS = {"content": ("output",), "tool_call_id": ("call_id",), "role": ()}  # function_call_output's


@dataclass
class MessageSource:
    """Where a chat message came from: a field whose text it is (`instructions`, a string `input`) or an input item
    (a `function_call_output` is a tool message), and the input items of its tool calls."""

    loc: tuple[str | int, ...]
    kind: str = "message"
    calls: list[int] = field(default_factory=list)

    def place(self, rest: Sequence[str | int]) -> tuple[str | int, ...]:
        """The Responses request's place of `rest` (a path under the chat message) in what it came from."""
        head = rest[0] if rest else None
        if len(self.loc) == 1 and head == "content":
            return (*self.loc, *rest[1:])
        if head == "tool_calls" and self.calls:
            k = rest[1] if len(rest) > 1 and isinstance(rest[1], int) and rest[1] < len(self.calls) else 0
            under = list(rest[2:])
            if under[:1] == ["function"]:
                under = under[1:]
            elif under[:1] == ["id"]:
                under = ["call_id", *under[1:]]
            return ("input", self.calls[k], *under)
        if self.kind == "function_call_output" and head in TOOL_MESSAGE_FIELDS:
            return (*self.loc, *TOOL_MESSAGE_FIELDS[str(head)], *rest[1:])
        return (*self.loc, *rest)


def renamed(error: Any, sources: Sequence[MessageSource]) -> dict[str, Any]:
    """A chat request's refusal located in the Responses request: messages[i] is the item it came from."""
    loc = list(error.get("loc", ()))
    if loc[:1] == ["messages"] and len(loc) > 1 and isinstance(loc[1], int) and loc[1] < len(sources):
        loc = list(sources[loc[1]].place(loc[2:]))
    elif loc[:1] == ["messages"]:
        loc = ["input", *loc[1:]]
    elif loc and loc[0] in RESPONSES_NAMES:
        loc = [*RESPONSES_NAMES[loc[0]], *loc[1:]]
    return {**error, "loc": ("body", *loc)}


def chat_messages(
    instructions: str | None, items: str | list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[MessageSource]]:
    """The chat messages of `instructions` and `input`, and where each came from (for refusals): a run of
    `function_call` items is one assistant message's calls (after the assistant's text, when it came just before)."""
    messages: list[dict[str, Any]] = []
    sources: list[MessageSource] = []
    if instructions is not None:
        messages.append({"role": "system", "content": instructions})
        sources.append(MessageSource(("instructions",)))
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}], [*sources, MessageSource(("input",))]
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "function_call":
            call = tool_call_of(item, i)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and sources[-1].loc[:1] == ("input",):
                last.setdefault("tool_calls", []).append(call)
                sources[-1].calls.append(i)
                continue
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            sources.append(MessageSource(("input", i), kind, [i]))
            continue
        if kind == "function_call_output":
            messages.append(tool_message_of(item, i))
        elif kind == "message":
            messages.append({"role": item.get("role"), "content": chat_content(item.get("content"))})
        else:
            raise item_refused(i, "type", f"items of type {kind!r} are not supported (messages and function calls)")
        sources.append(MessageSource(("input", i), kind))
    return messages, sources


def chat_content(content: Any) -> Any:
    """A message's content: a string, or its parts as chat's text parts (`input_text`, and `output_text` in an
    assistant message sent back); any other part keeps its type, for chat's refusal to name it."""
    if not isinstance(content, list):
        return content
    texts = ("input_text", "output_text")
    return [{**p, "type": "text"} if isinstance(p, dict) and p.get("type") in texts else p for p in content]


def tool_call_of(item: dict[str, Any], index: int) -> dict[str, Any]:
    for name in ("call_id", "name", "arguments"):
        if not isinstance(item.get(name), str):
            raise item_refused(index, name, "a function_call item needs call_id, name and arguments as strings")
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item["arguments"]},
    }


def tool_message_of(item: dict[str, Any], index: int) -> dict[str, Any]:
    if not isinstance(item.get("call_id"), str):
        raise item_refused(index, "call_id", "a function_call_output item needs the call_id it answers")
    return {"role": "tool", "tool_call_id": item["call_id"], "content": chat_content(item.get("output"))}


def item_refused(index: int, name: str, message: str) -> RequestValidationError:
    """A refusal of input item `index`'s field `name`."""
    return refused(("input", index, name), message)


def refused(loc: tuple[str | int, ...], message: str) -> RequestValidationError:
    return RequestValidationError([{"type": "invalid_value", "loc": ("body", *loc), "msg": message}])


def chat_tool(tool: dict[str, Any], index: int) -> dict[str, Any]:
    """A Responses function tool ({"type": "function", "name": ..., "parameters": ...}) as chat nests it."""
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        kind = tool.get("type")
        what = f"tools of type {kind!r} are not supported" if kind != "function" else "a function tool needs a name"
        raise refused(("tools", index), f'{what}: send {{"type": "function", "name": ..., "parameters": {{...}}}}')
    function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if key in tool}
    return {"type": "function", "function": function}


def chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice  # "none", "auto", "required": chat's own check refuses anything else
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise refused(("tool_choice",), 'send "none", "auto", "required" or {"type": "function", "name": ...}')
    return {"type": "function", "function": {"name": choice["name"]}}


def chat_response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format`: {"type": "json_schema", "name", "schema", ...} is flat here."""
    form = (text or {}).get("format")
    if not isinstance(form, dict) or form.get("type") != "json_schema":
        return form
    if not isinstance(form.get("name"), str):  # OpenAI's and vLLM's rule
        raise refused(("text", "format", "name"), 'a json_schema format needs a "name" (a string)')
    schema = {key: value for key, value in form.items() if key != "type"}
    return {"type": "json_schema", "json_schema": schema}


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[ChatTokenLogprob] = Field(default_factory=list)


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = Field(default_factory=list)


class FunctionCallItem(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    call_id: str
    name: str
    arguments: str


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0  # the OpenAI SDK's newer releases require it


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int

    @classmethod
    def of(cls, usage: Usage) -> ResponseUsage:
        return cls(
            input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens, total_tokens=usage.total_tokens
        )


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


OutputItem = OutputMessage | FunctionCallItem
ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed"]
KEEP_ALIVE = ": keep-alive\n\n"  # an SSE comment (clients skip it): a round whose text is held back still sends


class ResponseError(BaseModel):
    code: Literal["server_error"] = "server_error"  # OpenAI's codes are its own; the `error` event carries ours
    message: str


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=now)
    status: ResponseStatus = "in_progress"
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: None = None
    reasoning: dict[str, Any] | None = None
    store: bool = False
    temperature: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_p: float | None = None
    top_logprobs: int | None = None
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def opened(cls, req: ResponsesRequest, chat: ChatCompletionRequest, model: str) -> ResponseObject:
        """The Response as a stream's first events show it: what was asked, nothing written yet."""
        return cls(
            id=new_item_id("resp"),
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            model=model,
            parallel_tool_calls=req.parallel_tool_calls,
            reasoning=req.reasoning,
            temperature=chat.temperature,
            text={"format": {"type": "text"}, **(req.text or {})},
            tool_choice=req.tool_choice,
            tools=req.tools or [],
            top_p=chat.top_p,
            top_logprobs=req.top_logprobs,
            user=req.user,
            metadata=req.metadata or {},
        )

    def finished(self, output: list[OutputItem], usage: Usage, cut_short: bool) -> ResponseObject:
        """The Response once written: "incomplete" where `max_output_tokens` (or the context) cut it short."""
        status: ResponseStatus = "incomplete" if cut_short else "completed"
        details = IncompleteDetails() if cut_short else None
        return self.model_copy(
            update={"status": status, "incomplete_details": details, "output": output, "usage": ResponseUsage.of(usage)}
        )


def output_items(
    content: str | None, calls: Sequence[ToolCall], logprobs: ChatLogprobs | None, status: ResponseStatus
) -> list[OutputItem]:
    """A reply's output items: its text as a message (none when it is tool calls alone), then each call."""
    items: list[OutputItem] = []
    if content is not None:
        text = OutputText(text=content, logprobs=logprobs.content if logprobs is not None else [])
        items.append(OutputMessage(id=new_item_id("msg"), status=status, content=[text]))
    for call in calls:
        name, arguments = call.function.name, call.function.arguments
        items.append(FunctionCallItem(id=new_item_id("fc"), call_id=call.id, name=name, arguments=arguments))
    return items


class ResponseEvents:
    """A streamed Response's events, in OpenAI's order: `response.created`, `response.in_progress`; the message's
    `output_item.added` and `content_part.added` at its first text, an `output_text.delta` per chunk of text, then
    its `output_text.done`, `content_part.done` and `output_item.done`; each tool call's item added, its arguments
    (one delta, whole: calls are read once the reply ends) and done; last `response.completed` (or
    `response.incomplete`) with the whole Response; a failure is an `error` event, then `response.failed`. Every event
    carries its `sequence_number`."""

    def __init__(self, response: ResponseObject) -> None:
        self.response = response
        self.sequence = 0
        self.message: OutputMessage | None = None
        self.texts: list[str] = []
        self.logprobs: list[ChatTokenLogprob] = []
        self.unsent = 0  # entries of `logprobs` whose text is held back: they go with the next delta

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def opening(self) -> list[dict[str, Any]]:
        snapshot = self.response.model_dump()
        return [
            self.event("response.created", response=snapshot),
            self.event("response.in_progress", response=snapshot),
        ]

    def text(self, delta: str, logprobs: ChatLogprobs | None) -> list[dict[str, Any]]:
        """A chunk's text (and its tokens' log-probabilities), opening the message at its first; no event for a
        chunk whose text is held back (it may start a tool call): its log-probabilities go with the next delta (by
        chunk, not by character). The deltas' add up to the message's unless the reply holds tool calls: their
        tokens count in the message's log-probabilities (as in a unary Response) and go in no delta."""
        self.logprobs += logprobs.content if logprobs is not None else []
        self.unsent += len(logprobs.content) if logprobs is not None else 0
        if not delta:
            return []
        events = self.open_message() if self.message is None else []
        self.texts.append(delta)
        sent = [entry.model_dump() for entry in self.logprobs[len(self.logprobs) - self.unsent :]]
        self.unsent = 0
        return [*events, self.event("response.output_text.delta", **self.text_place(), delta=delta, logprobs=sent)]

    def open_message(self) -> list[dict[str, Any]]:
        self.message = OutputMessage(id=new_item_id("msg"), status="in_progress")
        return [
            self.event("response.output_item.added", output_index=0, item=self.message.model_dump()),
            self.event("response.content_part.added", **self.text_place(), part=OutputText(text="").model_dump()),
        ]

    def text_place(self) -> dict[str, Any]:
        """Where the message's text is: its item (the first output) and its one part."""
        assert self.message is not None
        return {"item_id": self.message.id, "output_index": 0, "content_index": 0}

    def written(self, status: ResponseStatus, logprobs: list[ChatTokenLogprob]) -> OutputMessage:
        """The message as written so far, in `status`, with `logprobs`."""
        assert self.message is not None
        text = OutputText(text="".join(self.texts), logprobs=logprobs)
        return self.message.model_copy(update={"status": status, "content": [text]})

    def closing(self, calls: Sequence[ToolCall], usage: Usage, cut_short: bool) -> list[dict[str, Any]]:
        """The reply's end: its message closed (opened first when the reply is neither text nor calls), its calls,
        and the finished Response."""
        events: list[dict[str, Any]] = []
        if self.message is None and not calls:
            events += self.open_message()
        status: ResponseStatus = "incomplete" if cut_short else "completed"
        output: list[OutputItem] = []
        if self.message is not None:
            message = self.written(status, self.logprobs)
            output.append(message)
            text = message.content[0].model_dump()
            events += [
                self.event(
                    "response.output_text.done", **self.text_place(), text=text["text"], logprobs=text["logprobs"]
                ),
                self.event("response.content_part.done", **self.text_place(), part=text),
                self.event("response.output_item.done", output_index=0, item=message.model_dump()),
            ]
        for call in output_items(None, calls, None, status):
            index = len(output)
            output.append(call)
            events += self.call_events(call, index)  # type: ignore[arg-type]
        finished = self.response.finished(output, usage, cut_short)
        kind = "response.incomplete" if cut_short else "response.completed"
        return [*events, self.event(kind, response=finished.model_dump())]

    def failure(self, code: str, message: str) -> list[dict[str, Any]]:
        """A failure after the stream started: OpenAI's `error` event, then `response.failed` with what was written."""
        output: list[OutputItem] = []
        if self.message is not None:  # its text so far, and the log-probabilities of that text (not of held-back text)
            output.append(self.written("incomplete", self.logprobs[: len(self.logprobs) - self.unsent]))
        failed = self.response.model_copy(
            update={"status": "failed", "error": ResponseError(message=message), "output": output}
        )
        return [
            self.event("error", code=code, message=message, param=None),
            self.event("response.failed", response=failed.model_dump()),
        ]

    def call_events(self, call: FunctionCallItem, index: int) -> list[dict[str, Any]]:
        opened = call.model_copy(update={"status": "in_progress", "arguments": ""})
        where = {"item_id": call.id, "output_index": index}
        return [
            self.event("response.output_item.added", output_index=index, item=opened.model_dump()),
            self.event("response.function_call_arguments.delta", **where, delta=call.arguments),
            self.event("response.function_call_arguments.done", **where, name=call.name, arguments=call.arguments),
            self.event("response.output_item.done", output_index=index, item=call.model_dump()),
        ]


def response_sse(events: Sequence[dict[str, Any]]) -> str:
    """Server-sent events as OpenAI sends a Response's: each named by its type."""
    return "".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in events)

"""Chat conversations → one prompt, with the target tokenizer's own chat template (no gRPC here).

The gRPC servicer and the OpenAI-compatible HTTP API both call `render_chat`; the result is
an ordinary prompt for the Orchestrator, so chat requests run the same propose/verify loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from calispec_core.errors import InvalidArgument
from calispec_core.limits import MAX_PROMPT_CHARS, require_unicode

ROLES = ("system", "user", "assistant")
NO_TOOL_CALLS = "tool calls and their results need the HTTP chat API of a coordinator started with --tool-call-parser"
TOOL_CALLS_REFUSED = f"{NO_TOOL_CALLS} (send an empty tool_calls or leave it out)"
MAX_CHAT_MESSAGES = 1024


class InvalidParam(InvalidArgument):
    """A request the coordinator refuses, naming the field at fault as the OpenAI API's errors do
    (`messages[1].role`, `max_tokens`); the HTTP API puts it in the error's `param`."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ChatTurn:
    role: str
    content: str
    tool_calls: tuple[dict[str, Any], ...] = ()  # an assistant's calls, as templates read them (tool_calls.py)
    tool_call_id: str | None = None  # a tool message's answer to a call

    def message(self) -> dict[str, Any]:
        """The turn as chat templates read it."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = list(self.tool_calls)
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


def render_chat(
    tokenizer: PreTrainedTokenizerBase,
    turns: Sequence[ChatTurn],
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    template_kwargs: Mapping[str, Any] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_turns: bool = False,
) -> str:
    """The conversation as the model was trained to see it, ending where the assistant's reply starts (without
    `add_generation_prompt`: after the last message; with `continue_final_message`: inside it, for the reply to
    continue it, as transformers and vLLM render an assistant prefill). `template_kwargs`: the template's own
    variables (vLLM's chat_template_kwargs); `tools`: the functions the model may call (the template describes
    them); `tool_turns`: tool messages and assistant calls are accepted (a server that parses calls)."""
    _validate(turns, tool_turns)
    if continue_final_message and turns[-1].tool_calls:  # templates write calls after the content: they would be cut
        raise InvalidParam(
            "cannot continue a final message that holds tool calls", f"messages[{len(turns) - 1}].tool_calls"
        )
    if not tokenizer.chat_template:
        raise InvalidArgument("the model's tokenizer has no chat template: send a raw prompt instead of messages")
    messages = [t.message() for t in turns]
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            **({"tools": list(tools)} if tools else {}),
            **(template_kwargs or {}),
        )
    except TemplateError as exc:  # templates raise_exception() on conversations they do not accept
        raise InvalidParam(f"the chat template rejected the messages: {exc}", "messages") from exc
    except ValueError as exc:  # transformers: the rendered text does not hold the final message to continue
        if not continue_final_message:
            raise
        raise InvalidParam(
            "cannot continue the final message: the chat template does not end with it", "messages"
        ) from exc
    return _without_duplicate_bos(tokenizer, text)


def _validate(turns: Sequence[ChatTurn], tool_turns: bool = False) -> None:
    if not turns:
        raise InvalidParam("messages must not be empty", "messages")
    if len(turns) > MAX_CHAT_MESSAGES:
        raise InvalidParam(f"at most {MAX_CHAT_MESSAGES} messages", "messages")
    for i, turn in enumerate(turns):
        role = f"messages[{i}].role"
        if turn.role == "tool" and not tool_turns:  # a tool's result: there are no tool calls to answer
            raise InvalidParam(f"{role} 'tool' is not supported: {NO_TOOL_CALLS}", role)
        if turn.tool_calls and not tool_turns:
            raise InvalidParam(TOOL_CALLS_REFUSED, f"messages[{i}].tool_calls")
        if turn.role not in (*ROLES, "tool"):
            roles = (*ROLES, "tool") if tool_turns else ROLES
            raise InvalidParam(f"{role} must be one of {', '.join(roles)}, got {turn.role!r}", role)
        try:
            require_unicode(turn.content, f"messages[{i}].content")
        except InvalidArgument as exc:
            raise InvalidParam(str(exc), f"messages[{i}].content") from None
    if sum(len(t.content) for t in turns) > MAX_PROMPT_CHARS:
        raise InvalidParam(f"messages longer than {MAX_PROMPT_CHARS} characters", "messages")


def _without_duplicate_bos(tokenizer: PreTrainedTokenizerBase, text: str) -> str:
    """Templates that write the BOS token and tokenizers that add it on encode would double it."""
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and tokenizer.encode("a")[:1] == [tokenizer.bos_token_id]:
        return text[len(bos) :]
    return text

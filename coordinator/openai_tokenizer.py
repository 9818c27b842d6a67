"""vLLM's tokenizer endpoints (no gRPC here): `POST /tokenize`, `POST /detokenize`, `GET /tokenizer_info`.

Clients that send token ids count and cut their prompts with the served tokenizer without loading it themselves:
lm-eval's `local-completions` looks for `/tokenizer_info` and `/tokenize` at the server's root and, when both
answer, tokenizes remotely. `/tokenize` encodes a text prompt as a completion request's prompt is encoded, and chat
messages as a chat request's are rendered and encoded, so its `count` is that request's `usage.prompt_tokens`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator, model_validator
from transformers import PreTrainedTokenizerBase

from calispec_core.errors import InvalidArgument
from calispec_core.limits import validate_prompt
from coordinator.chat import TOOL_CALLS_REFUSED, ChatTurn, InvalidParam, render_chat
from coordinator.openai_protocol import ChatMessage, ChatRendering, OpenAIModel, invalid, is_token_id
from coordinator.tool_calls import template_tool_calls

TOKENIZE_PATH = "/tokenize"
DETOKENIZE_PATH = "/detokenize"
TOKENIZER_INFO_PATH = "/tokenizer_info"


class TokenizeRequest(ChatRendering):
    """A text prompt, or chat messages (exactly one), rendered as a chat request renders them (its
    `add_generation_prompt`, `continue_final_message`)."""

    model: str | None = None  # optional, as vLLM's; when sent, the served model's name
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True  # the tokenizer's own (BOS where it adds one), as a request's prompt gets
    return_token_strs: bool = False  # each token's string too (the tokenizer's, not decoded text)

    @model_validator(mode="before")
    @classmethod
    def _rendering_is_for_messages(cls, data: Any) -> Any:
        """A text prompt is not rendered: the chat rendering fields are left out for it, as vLLM's request for a
        prompt has none (`continue_final_message: true` would get the 400 for add_generation_prompt's default)."""
        if isinstance(data, dict) and data.get("prompt") is not None and data.get("messages") is None:
            return {name: value for name, value in data.items() if name not in ChatRendering.model_fields}
        return data

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise invalid("send exactly one of prompt and messages")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[int]

    @field_validator("tokens", mode="before")
    @classmethod
    def _token_ids(cls, value: Any) -> Any:
        if isinstance(value, list) and not all(is_token_id(t) for t in value):
            raise invalid("must be a list of token ids (integers >= 0)")
        return value


class DetokenizeResponse(BaseModel):
    prompt: str


class TokenizerInfo(BaseModel):
    """What lm-eval's remote tokenizer reads (vLLM's `TokenizerInfoResponse`, which carries the tokenizer's config)."""

    model_config = ConfigDict(extra="allow")
    tokenizer_class: str


def render_messages(
    tokenizer: PreTrainedTokenizerBase,
    req: ChatRendering,
    messages: Sequence[ChatMessage],
    parses_tool_calls: bool,
) -> str:
    """The messages as the model's template renders them with `req`'s rendering fields: one rendering for a chat
    request and `/tokenize`, so that the latter's count is the former's `usage.prompt_tokens`. Where the server parses
    tool calls (`parses_tool_calls`) or the request forces one, the request's tools are rendered (unless its
    tool_choice is "none") and a conversation may hold calls and their results; otherwise no tools are rendered."""
    tool_turns = parses_tool_calls or req.forced_call() is not None
    turns = [chat_turn(m, i, tool_turns) for i, m in enumerate(messages)]
    tools = req.rendered_tools() if tool_turns else None
    return render_chat(
        tokenizer,
        turns,
        req.add_generation_prompt,
        req.continue_final_message,
        req.chat_template_kwargs,
        tools,
        tool_turns,
    )


def chat_turn(message: ChatMessage, index: int, tool_turns: bool) -> ChatTurn:
    """A message as `render_chat` takes it; its tool calls refused before they are read where none are parsed, and
    on any message but an assistant's."""
    calls: tuple[dict[str, Any], ...] = ()
    if message.tool_calls:
        where = f"messages[{index}].tool_calls"
        if not tool_turns:
            raise InvalidParam(TOOL_CALLS_REFUSED, where)
        if message.role != "assistant":
            raise InvalidParam(f"only an assistant message has tool calls, not a {message.role!r} one", where)
        try:
            calls = tuple(template_tool_calls([c.model_dump() for c in message.tool_calls], where))
        except ValueError as exc:
            raise InvalidParam(str(exc), where) from None
    return ChatTurn(message.role, message.content, calls, message.tool_call_id)


def tokenize(
    tokenizer: PreTrainedTokenizerBase, req: TokenizeRequest, context_length: int, tool_turns: bool = False
) -> TokenizeResponse:
    if req.messages is not None:
        text = render_messages(tokenizer, req, req.messages, tool_turns)
    else:
        assert req.prompt is not None
        try:
            validate_prompt(req.prompt)
        except InvalidArgument as exc:
            raise InvalidParam(str(exc), "prompt") from None
        text = req.prompt
    ids = tokenizer.encode(text, add_special_tokens=req.add_special_tokens)
    strs = tokenizer.convert_ids_to_tokens(ids) if req.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=context_length, tokens=ids, token_strs=strs)


def detokenize(tokenizer: PreTrainedTokenizerBase, req: DetokenizeRequest, context_length: int) -> DetokenizeResponse:
    """The ids' text, special tokens kept (what the model reads); ids the tokenizer cannot decode are a 400."""
    if len(req.tokens) > context_length:
        raise InvalidParam(f"at most {context_length} tokens (the context), got {len(req.tokens)}", "tokens")
    size = len(tokenizer)
    bad = next((t for t in req.tokens if t >= size), None)
    if bad is not None:
        raise InvalidParam(f"{bad} is not a token id of the tokenizer (0 to {size - 1})", "tokens")
    return DetokenizeResponse(prompt=tokenizer.decode(req.tokens))


def tokenizer_info(tokenizer: PreTrainedTokenizerBase, context_length: int) -> TokenizerInfo:
    return TokenizerInfo(
        tokenizer_class=type(tokenizer).__name__,
        eos_token=tokenizer.eos_token,
        bos_token=tokenizer.bos_token,
        pad_token=tokenizer.pad_token,
        chat_template=tokenizer.chat_template,
        model_max_length=context_length,
    )

"""Typed request and response models of the OpenAI-compatible HTTP API (pydantic).

The shapes follow OpenAI's `/v1/completions`, `/v1/chat/completions` and `/v1/models`, as vLLM,
SGLang and TGI serve them. Calispec's own parameters ride along as extra body fields
(`extra_body={"mode": "sd", "gamma": 4}` in the `openai` client). Fields a client may send
but Calispec does not implement (logprobs, n > 1, penalties, ...) are refused with 400 rather
than silently ignored; unknown fields are ignored, as OpenAI's servers do.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from calispec.types import MODE_NAMES, FinishReason

ModeName = Literal[MODE_NAMES]  # type: ignore[valid-type]


class CalispecParams(BaseModel):
    """Sampling and speculative-decoding parameters shared by both endpoints."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    model: str
    max_tokens: int | None = None  # unset: the server's default (the domain validates all ranges)
    temperature: float = 1.0  # OpenAI's default; 0 is greedy
    top_p: float = 1.0
    n: Literal[1] = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Calispec's own (extra body fields)
    top_k: int = 0
    mode: ModeName | None = None
    gamma: int | None = None  # speculative tokens per round
    tau: float | None = None
    lambda_: int | None = Field(default=None, alias="lambda")
    return_token_ids: bool = False  # vLLM's extension: each choice carries its new token ids
    # not implemented: accepted only at their no-op values (clients send those by default)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    best_of: Literal[1] | None = None

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float) -> float:
        if value != 0:
            raise ValueError("penalties are not supported: send 0 or leave it out")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("logit_bias is not supported: send {} or leave it out")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage_chunk(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class StreamOptions(BaseModel):
    include_usage: bool = False


class CompletionRequest(CalispecParams):
    prompt: str | list[str]
    echo: Literal[False] = False
    logprobs: None = None
    suffix: None = None


class ChatMessage(BaseModel):
    role: str
    content: str


class ChatCompletionRequest(CalispecParams):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens
    logprobs: Literal[False] = False

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


def openai_finish_reason(reason: FinishReason | None) -> Literal["stop", "length"] | None:
    """EOS and stop strings are both OpenAI's "stop"."""
    if reason is None:
        return None
    return "length" if reason == FinishReason.LENGTH else "stop"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None
    token_ids: list[int] | None = None  # with return_token_ids


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "calispec"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody

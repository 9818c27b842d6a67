"""Typed Python client for the Calispec public API (sync and asyncio).

    with CalispecClient("127.0.0.1:50050") as client:
        result = client.generate("def add(a, b):", max_new_tokens=32, mode="csd")
        print(result.text, result.stats.acceptance_rate)
        for chunk in client.generate_stream("Once upon a time", timeout=30):
            print(chunk.text, end="")
        reply = client.chat([{"role": "user", "content": "Write a haiku about tests"}])

`chat`/`chat_stream` send the conversation; the coordinator renders it with the target model's
chat template (INVALID_ARGUMENT when the model has none: send a raw prompt then).

Secured coordinators: `CalispecClient(address, token=KEY, tls_ca="ca.pem")`, or set
CALISPEC_TOKEN and CALISPEC_TLS_CA (see docs/security.md). Credentials it cannot use (a CA bundle
it cannot read or that holds no PEM certificate, a token that is not printable ASCII without
spaces) raise ValueError when the client is made.

Errors arrive as `CalispecRpcError` with the gRPC status code name (`INVALID_ARGUMENT`,
`DEADLINE_EXCEEDED`, ...). `timeout` is the request's deadline in seconds; without one the
server applies its own (the coordinator's `--rpc-timeout`, 60 s by default). `request_id`
(optional) is the id every service logs the request under (`x-request-id`; the coordinator
makes one if absent).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import grpc

from calispec._channel import ClientAuth
from calispec.types import (
    REQUEST_ID_METADATA,
    FinishReason,
    GenerationStats,
    Mode,
    OutputConstraint,
    TokenLogprob,
    is_valid_request_id,
)
from calispec.v1 import coordinator_pb2, coordinator_pb2_grpc

# A timeout this long or longer is sent as none (the server's default applies; it reads such a remaining time as
# none too).
NO_DEADLINE_S = 1e9


class CalispecRpcError(Exception):
    """A failed call: `code` is the gRPC status name, `details` the server's message."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details

    @classmethod
    def from_rpc(cls, exc: grpc.RpcError) -> CalispecRpcError:
        return cls(exc.code().name, exc.details() or "")


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "length", "eos" or "stop"
    stats: GenerationStats
    request_id: str
    logprobs: list[TokenLogprob] | None = None  # one per token id, when asked for (`logprobs=k`)
    # with `prompt_logprobs=k`: the prompt's token ids, and one entry per prompt token from the second
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None

    def to_dict(self) -> dict[str, Any]:
        result = {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_dict(),
            "request_id": self.request_id,
        }
        if self.logprobs is not None:
            result["logprobs"] = [asdict(lp) for lp in self.logprobs]
        if self.prompt_logprobs is not None:
            result["prompt_token_ids"] = self.prompt_token_ids
            result["prompt_logprobs"] = [asdict(lp) for lp in self.prompt_logprobs]
        return result


@dataclass(frozen=True)
class StreamChunk:
    text: str
    token_ids: list[int]
    request_id: str
    finish_reason: str | None = None  # set on the last chunk
    stats: GenerationStats | None = None  # set on the last chunk
    logprobs: list[TokenLogprob] | None = None  # one per token id, when asked for
    prompt_token_ids: list[int] | None = None  # on the first chunk, with `prompt_logprobs=k`
    prompt_logprobs: list[TokenLogprob] | None = None


def build_params(
    *,
    max_new_tokens: int = 0,
    temperature: float = 0.0,
    top_p: float = 0.0,
    top_k: int = 0,
    seed: int | None = None,
    stop: str | Sequence[str] | None = (),
    num_speculative_tokens: int | None = None,
    mode: str | Mode | None = None,
    tau: float | None = None,
    lambda_: int | None = None,
    ignore_eos: bool = False,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
    stop_token_ids: Sequence[int] = (),
    constraint: OutputConstraint | None = None,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    repetition_penalty: float = 1.0,
    min_p: float = 0.0,
    min_tokens: int = 0,
    logit_bias: Mapping[int, float] | None = None,
    allowed_token_ids: Sequence[int] | None = None,
    bad_words: Sequence[str] | None = None,
) -> coordinator_pb2.GenerationParams:
    """Request parameters; None / 0 leaves a field to the server's default. `ignore_eos`: go on past EOS to
    `max_new_tokens` (outputs of a fixed length, for load tests). `logprobs=k`: each new token's log-probability
    under the target and the k most likely tokens at its position (0 to 20); `prompt_logprobs=k`: the same for
    each prompt token from the second (under the tokens before it). `stop_token_ids`: a new token among them ends
    the request (kept in the output; finish reason "stop"), as vLLM's. `constraint`: structured output, the grammar
    the new tokens follow (`OutputConstraint.of(json=schema)`, `regex=`, `choice=`, `grammar=`, `json_object=True`).
    `presence_penalty`, `frequency_penalty`, `repetition_penalty`, `min_p`, `min_tokens`, `logit_bias` (token id ->
    bias), `allowed_token_ids` and `bad_words`: vLLM's sampling parameters of those names (their defaults are off)."""
    msg = coordinator_pb2.GenerationParams()
    for name, value in (
        ("max_new_tokens", max_new_tokens),
        ("temperature", temperature),
        ("top_p", top_p),
        ("top_k", top_k),
        ("ignore_eos", ignore_eos),
        ("seed", seed),
        ("num_speculative_tokens", num_speculative_tokens),
        ("tau", tau),
        ("lambda_", lambda_),
        ("logprobs", logprobs),
        ("prompt_logprobs", prompt_logprobs),
    ):
        if value is not None:
            with _naming(name):
                setattr(msg, name, value)
    with _naming("stop"):
        msg.stop.extend([] if stop is None else [stop] if isinstance(stop, str) else stop)  # one string: not letters
    with _naming("stop_token_ids"):
        msg.stop_token_ids.extend(stop_token_ids)
    if mode is not None:
        msg.mode = int(Mode.parse(mode) if isinstance(mode, str) else mode)
    if constraint is not None:
        msg.constraint.CopyFrom(constraint.to_pb())
    if not repetition_penalty > 0:  # 0 is the wire's "unset": it would be sent as off
        raise ValueError(f"repetition_penalty: must be > 0, got {repetition_penalty}")
    rules = {
        "presence_penalty": presence_penalty,
        "frequency_penalty": frequency_penalty,
        "repetition_penalty": repetition_penalty if repetition_penalty != 1.0 else 0.0,  # 0: unset
        "min_p": min_p,
        "min_tokens": min_tokens,
    }
    if any(rules.values()) or logit_bias or allowed_token_ids or bad_words:
        for name, value in rules.items():
            with _naming(name):
                setattr(msg.rules, name, value)
        with _naming("logit_bias"):
            msg.rules.logit_bias.update(logit_bias or {})
        with _naming("allowed_token_ids"):
            msg.rules.allowed_token_ids.extend(allowed_token_ids or ())
        with _naming("bad_words"):
            msg.rules.bad_words.extend([bad_words] if isinstance(bad_words, str) else bad_words or ())
    return msg


@contextmanager
def _naming(argument: str) -> Iterator[None]:
    """protobuf refuses a value the field cannot hold as "Value out of range: -1" or "bad argument type for built-in
    operation": the caller learns which argument (a ValueError or TypeError still)."""
    try:
        yield
    except TypeError as exc:
        raise TypeError(f"{argument}: {exc}") from exc
    except ValueError as exc:  # UnicodeEncodeError too (lone surrogates: text read with surrogateescape)
        raise ValueError(f"{argument}: {exc}") from exc


Messages = Sequence[Mapping[str, str]]  # [{"role": "user", "content": "..."}, ...]


def chat_messages(messages: Messages) -> coordinator_pb2.ChatMessages:
    out = coordinator_pb2.ChatMessages()
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise ValueError(f"messages[{i}] must be a mapping with a 'role' and a 'content', got {message!r:.80}")
        with _naming(f"messages[{i}]"):
            out.messages.add(role=message["role"], content=message["content"])
    return out


def _requests(
    prompt: str | Sequence[int] | None, messages: Messages | None, params: dict[str, Any]
) -> tuple[coordinator_pb2.GenerateRequest, coordinator_pb2.GenerateStreamRequest]:
    """The unary and the streaming request for a raw prompt, its token ids (the target tokenizer's) or a
    conversation (exactly one of them)."""
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of a prompt and chat messages")
    fields_ = {"params": build_params(**params)}
    if messages is not None:
        fields_["messages"] = chat_messages(messages)
    elif isinstance(prompt, str):
        fields_["prompt"] = prompt
    elif isinstance(prompt, (bytes, bytearray, memoryview)):  # its bytes went out as token ids
        raise TypeError("prompt must be a str or a sequence of token ids, not bytes: decode it first")
    else:
        with _naming("prompt"):
            fields_["prompt_token_ids"] = coordinator_pb2.PromptTokens(ids=list(prompt))
    return coordinator_pb2.GenerateRequest(**fields_), coordinator_pb2.GenerateStreamRequest(**fields_)


def _finish_name(value: int) -> str | None:
    return FinishReason(value).name.lower() if value else None


def _stats(msg: coordinator_pb2.GenerationStats) -> GenerationStats:
    return GenerationStats(**{f.name: getattr(msg, f.name) for f in fields(GenerationStats)})


def _logprobs(
    msg: coordinator_pb2.GenerateResponse | coordinator_pb2.GenerateStreamResponse,
) -> list[TokenLogprob] | None:
    """None when the request asked for none (every response that has tokens has them then)."""
    return [TokenLogprob.from_pb(lp) for lp in msg.logprobs] if msg.logprobs else None


def _prompt_report(
    msg: coordinator_pb2.GenerateResponse | coordinator_pb2.GenerateStreamResponse,
) -> tuple[list[int] | None, list[TokenLogprob] | None]:
    """The prompt's ids and log-probabilities; None, None where the message has none (not asked, a later chunk)."""
    if not msg.prompt_token_ids:
        return None, None
    return list(msg.prompt_token_ids), [TokenLogprob.from_pb(lp) for lp in msg.prompt_logprobs]


def _check_reported(
    msg: coordinator_pb2.GenerateResponse | coordinator_pb2.GenerateStreamResponse,
    params: coordinator_pb2.GenerationParams,
    first: bool,
) -> None:
    """A coordinator of a release before them drops `logprobs`/`prompt_logprobs` unread (protobuf's unknown
    fields): the figures asked for were lost without a word (found by probing upgrades); now an error."""
    if params.HasField("logprobs") and msg.token_ids and not msg.logprobs:
        missing = "log-probabilities"
    elif params.HasField("prompt_logprobs") and first and not msg.prompt_token_ids:
        missing = "prompt log-probabilities"
    else:
        return
    raise CalispecRpcError("FAILED_PRECONDITION", f"the coordinator sent no {missing}: it predates them; upgrade it")


def _result(msg: coordinator_pb2.GenerateResponse) -> GenerationResult:
    return GenerationResult(
        msg.text,
        list(msg.token_ids),
        _finish_name(msg.finish_reason) or "",
        _stats(msg.stats),
        msg.request_id,
        _logprobs(msg),
        *_prompt_report(msg),
    )


def _chunk(msg: coordinator_pb2.GenerateStreamResponse) -> StreamChunk:
    last = msg.finish_reason != 0
    return StreamChunk(
        msg.text,
        list(msg.token_ids),
        msg.request_id,
        _finish_name(msg.finish_reason),
        _stats(msg.stats) if last else None,
        _logprobs(msg),
        *_prompt_report(msg),
    )


def _timeout(timeout: float | None, default: float | None) -> float | None:
    """The call's deadline in seconds: 0 is one that has passed already; None sends none, so the server's
    `--rpc-timeout` applies, and so does anything from NO_DEADLINE_S up, infinity included (grpcio's clock
    overflows past ~7.4e9 s and failed such a call at once as DEADLINE_EXCEEDED). NaN is a ValueError."""
    value = timeout if timeout is not None else default
    if value is None:
        return None
    if math.isnan(value):
        raise ValueError("timeout must be a number of seconds or None, got nan")
    return None if value >= NO_DEADLINE_S else value


def _with_request_id(metadata: tuple[tuple[str, str], ...], request_id: str | None) -> tuple[tuple[str, str], ...]:
    """`x-request-id`: the id every service logs this request under (the coordinator makes one if absent)."""
    if not request_id:  # None or "": none sent
        return metadata
    if not is_valid_request_id(request_id):  # gRPC itself failed such metadata as INTERNAL
        raise ValueError(f"request_id must be 1-256 of A-Z a-z 0-9 . _ : , / + = @ -, got {request_id!r}")
    return (*metadata, (REQUEST_ID_METADATA, request_id))


class CalispecClient:
    """Blocking client; one channel, safe to share between threads."""

    def __init__(
        self,
        address: str,
        timeout: float | None = None,
        *,
        token: str | None = None,
        tls_ca: str | Path | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        """`token` (API key) and `tls_ca` default to CALISPEC_TOKEN / CALISPEC_TLS_CA ("": none, whatever the
        environment says); no CA: plaintext."""
        self.default_timeout = timeout
        auth = ClientAuth.resolve(token, tls_ca, tls_server_name)
        self._metadata = auth.metadata
        self._channel = auth.channel(address)
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)

    def generate(
        self, prompt: str | Sequence[int], *, timeout: float | None = None, request_id: str | None = None, **params: Any
    ) -> GenerationResult:
        return self._unary(_requests(prompt, None, params)[0], timeout, request_id)

    def chat(
        self, messages: Messages, *, timeout: float | None = None, request_id: str | None = None, **params: Any
    ) -> GenerationResult:
        return self._unary(_requests(None, messages, params)[0], timeout, request_id)

    def generate_stream(
        self, prompt: str | Sequence[int], *, timeout: float | None = None, request_id: str | None = None, **params: Any
    ) -> Iterator[StreamChunk]:
        return self._stream(_requests(prompt, None, params)[1], timeout, request_id)

    def chat_stream(
        self, messages: Messages, *, timeout: float | None = None, request_id: str | None = None, **params: Any
    ) -> Iterator[StreamChunk]:
        return self._stream(_requests(None, messages, params)[1], timeout, request_id)

    def _unary(
        self, request: coordinator_pb2.GenerateRequest, timeout: float | None, request_id: str | None
    ) -> GenerationResult:
        metadata = _with_request_id(self._metadata, request_id)
        try:
            msg = self._stub.Generate(request, timeout=_timeout(timeout, self.default_timeout), metadata=metadata)
        except grpc.RpcError as exc:
            raise CalispecRpcError.from_rpc(exc) from None
        _check_reported(msg, request.params, first=True)
        return _result(msg)

    def _stream(
        self, request: coordinator_pb2.GenerateStreamRequest, timeout: float | None, request_id: str | None
    ) -> Iterator[StreamChunk]:
        metadata = _with_request_id(self._metadata, request_id)
        call = self._stub.GenerateStream(request, timeout=_timeout(timeout, self.default_timeout), metadata=metadata)
        try:
            first = True
            for msg in call:
                _check_reported(msg, request.params, first)
                first = False
                yield _chunk(msg)
        except grpc.RpcError as exc:
            raise CalispecRpcError.from_rpc(exc) from None
        finally:
            call.cancel()  # no-op when finished; frees the server when the caller stops early

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> CalispecClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncCalispecClient:
    """asyncio client; create and use it inside one running event loop."""

    def __init__(
        self,
        address: str,
        timeout: float | None = None,
        *,
        token: str | None = None,
        tls_ca: str | Path | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        """`token` (API key) and `tls_ca` default to CALISPEC_TOKEN / CALISPEC_TLS_CA ("": none, whatever the
        environment says); no CA: plaintext."""
        self.default_timeout = timeout
        auth = ClientAuth.resolve(token, tls_ca, tls_server_name)
        self._metadata = auth.metadata
        self._channel = auth.aio_channel(address)
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)

    async def generate(
        self, prompt: str | Sequence[int], *, timeout: float | None = None, request_id: str | None = None, **params: Any
    ) -> GenerationResult:
        return await self._unary(_requests(prompt, None, params)[0], timeout, request_id)

    async def chat(
        self, messages: Messages, *, timeout: float | None = None, request_id: str | None = None, **params: Any
    ) -> GenerationResult:
        return await self._unary(_requests(None, messages, params)[0], timeout, request_id)

    def generate_stream(
        self, prompt: str | Sequence[int], *, timeout: float | None = None, request_id: str | None = None, **params: Any
    ) -> AsyncIterator[StreamChunk]:
        return self._stream(_requests(prompt, None, params)[1], timeout, request_id)

    def chat_stream(
        self, messages: Messages, *, timeout: float | None = None, request_id: str | None = None, **params: Any
    ) -> AsyncIterator[StreamChunk]:
        return self._stream(_requests(None, messages, params)[1], timeout, request_id)

    async def _unary(
        self, request: coordinator_pb2.GenerateRequest, timeout: float | None, request_id: str | None
    ) -> GenerationResult:
        metadata = _with_request_id(self._metadata, request_id)
        try:
            call = self._stub.Generate(request, timeout=_timeout(timeout, self.default_timeout), metadata=metadata)
            msg = await call
        except grpc.RpcError as exc:
            raise CalispecRpcError.from_rpc(exc) from None
        except asyncio.CancelledError:
            if _own_task_cancelled():
                raise
            raise CalispecRpcError("CANCELLED", "the client was closed while the call ran") from None
        _check_reported(msg, request.params, first=True)
        return _result(msg)

    async def _stream(
        self, request: coordinator_pb2.GenerateStreamRequest, timeout: float | None, request_id: str | None
    ) -> AsyncIterator[StreamChunk]:
        metadata = _with_request_id(self._metadata, request_id)
        call = self._stub.GenerateStream(request, timeout=_timeout(timeout, self.default_timeout), metadata=metadata)
        try:
            first = True
            async for msg in call:
                _check_reported(msg, request.params, first)
                first = False
                yield _chunk(msg)
        except grpc.RpcError as exc:
            raise CalispecRpcError.from_rpc(exc) from None
        except asyncio.CancelledError:
            if _own_task_cancelled():
                raise
            raise CalispecRpcError("CANCELLED", "the client was closed while the call ran") from None
        finally:
            call.cancel()

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncCalispecClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _own_task_cancelled() -> bool:
    """Whether a call's CancelledError is this task's own cancellation, not the client closed under the call
    (grpc.aio cancels its calls): that one is a CANCELLED CalispecRpcError, as the sync client raises, not a
    CancelledError that asyncio code takes for its own task's (found by probing)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0

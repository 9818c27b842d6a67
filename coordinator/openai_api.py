"""The OpenAI-compatible HTTP API, served from the coordinator process (FastAPI + uvicorn).

`/v1/models`, `/v1/models/{id}`, `/v1/completions`, `/v1/chat/completions`, `/v1/responses`, streaming by server-sent
events, and an unauthenticated `/health`. Requests drive the same Orchestrator as the gRPC servicer (no
second loop, no extra hop); the blocking generator runs in Starlette's thread pool. Errors use OpenAI's
shape and HTTP statuses. Each request gets the gRPC path's bookkeeping (`coordinator.request_log`:
metrics, one log line), a request id (`X-Request-Id`, echoed back), and a place in the drain (503 while
draining). `RequestGuard` checks the API key and the body's size, media type and coding before a byte of
the body is read. Every response, refusals included, is counted by route template, method and status
(`instrument`). What is checked before a request reaches the app (a deadline for its headers, its framing)
is `coordinator.http_transport`'s.
"""

from __future__ import annotations

import logging
import math
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import cache, partial
from typing import Any, TypeVar

import anyio
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from prometheus_client.exposition import choose_encoder
from prometheus_fastapi_instrumentator import Instrumentator
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import calispec
from calispec.types import FinishReason, Mode
from calispec_core.access import ApiKeys, QuotaBook, anonymous_caller, parse_bearer
from calispec_core.credentials import TlsConfig
from calispec_core.errors import CalispecError, InvalidField, NotFound, Unauthenticated, Unavailable
from calispec_core.generation import Defaults, GenerationParams, TokenLogprob
from calispec_core.metrics import new_registry
from calispec_core.observability import DrainGate
from calispec_core.request_context import REQUEST_ID_METADATA, bound_request_id, new_request_id, sanitize
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Deadline
from coordinator.chat import InvalidParam
from coordinator.config import (
    CANCEL_GRACE_S,
    HTTP_HEADER_TIMEOUT_S,
    HTTP_MAX_BODY_BYTES,
    HTTP_MAX_GENERATIONS,
    CoordinatorConfig,
)
from coordinator.engine import Chunk, Orchestrator
from coordinator.http_transport import guarded_protocol, serve
from coordinator.metrics import CoordinatorMetrics, RequestTimer
from coordinator.openai_generations import (
    GenerationSlots,
    HttpGeneration,
    Outcome,
    admitted,
    first_chunks,
    gathered,
    merged,
    usage_of,
)
from coordinator.openai_logprobs import (
    Echoed,
    TokenTexts,
    chat_logprobs,
    completion_logprobs,
    end_offset,
    joined,
    prompt_logprobs,
)
from coordinator.openai_protocol import (
    AssistantMessage,
    CalispecParams,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatFinish,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    DeltaToolCall,
    ErrorBody,
    ErrorResponse,
    FunctionCall,
    ModelCard,
    ModelList,
    ToolCall,
    Usage,
    context_overflow,
    new_id,
    now,
    openai_finish_reason,
    validation_error,
)
from coordinator.openai_responses import (
    KEEP_ALIVE,
    ChatForm,
    ResponseEvents,
    ResponseObject,
    ResponsesRequest,
    output_items,
    response_sse,
)
from coordinator.openai_tokenizer import (
    DETOKENIZE_PATH,
    TOKENIZE_PATH,
    TOKENIZER_INFO_PATH,
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    TokenizerInfo,
    detokenize,
    render_messages,
    tokenize,
    tokenizer_info,
)
from coordinator.request_log import tracked
from coordinator.tool_calls import ForcedCallStream, ParsedCall, ToolCallStream

log = logging.getLogger(__name__)

# gRPC status name of a domain error -> (HTTP status, OpenAI error type)
HTTP_ERRORS: dict[str, tuple[int, str]] = {
    "INVALID_ARGUMENT": (400, "invalid_request_error"),
    "FAILED_PRECONDITION": (400, "invalid_request_error"),
    "UNAUTHENTICATED": (401, "authentication_error"),
    "PERMISSION_DENIED": (403, "permission_error"),
    "NOT_FOUND": (404, "not_found_error"),
    "CANCELLED": (499, "cancelled"),
    "RESOURCE_EXHAUSTED": (429, "rate_limit_error"),
    "UNAVAILABLE": (503, "service_unavailable"),
    "DEADLINE_EXCEEDED": (504, "timeout_error"),
}
# the framework's own refusals (HTTPException: no route, wrong method, a body too large or unparsable)
# -> (OpenAI error type, code: the gRPC status name in lower case, as for the domain's errors)
HTTP_STATUS_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_argument"),
    404: ("not_found_error", "not_found"),
    405: ("invalid_request_error", "unimplemented"),
    413: ("invalid_request_error", "resource_exhausted"),  # what gRPC answers a message over its size limit
}
HEALTH_PATH = "/health"  # unauthenticated, as vLLM's: 200 serving, 503 draining or without a target replica
COMPLETIONS_PATH = "/v1/completions"
METRICS_PATH = "/metrics"  # the coordinator's registry, as its --metrics-port serves it: vLLM serves it here
VERSION_PATH = "/version"  # vLLM's: {"version": ...}, what dashboards and clients probe a server for
CHAT_PATH = "/v1/chat/completions"
RESPONSES_PATH = "/v1/responses"  # OpenAI's Responses API (coordinator.openai_responses)
JSON_BODY_PATHS = frozenset({COMPLETIONS_PATH, CHAT_PATH, RESPONSES_PATH, TOKENIZE_PATH, DETOKENIZE_PATH})
CALLER_SCOPE_KEY = "calispec.caller"  # the caller's name, as RequestGuard found it
T = TypeVar("T")
TOKENIZER_THREADS = 4  # /tokenize and /detokenize calls computing at once (their own threads)
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # proxies pass each event on at once
# A 500 is a bug: the OpenAI SDKs retry any 5xx (twice by default) unless this header says not to, and a retry would
# only run the failing request again. 503 and 504 (a replica down, a deadline) stay retryable.
NO_RETRY_HEADERS = {"x-should-retry": "false"}


@dataclass(frozen=True)
class ApiSettings:
    model_name: str  # what /v1/models lists and requests must name
    defaults: Defaults
    request_timeout_s: float  # HTTP carries no deadline: each request gets this one
    keys: ApiKeys | None = None  # the coordinator's API keys: requests need `Authorization: Bearer <key>`
    quotas: QuotaBook | None = None  # the coordinator's per-caller quotas (shared with gRPC): 429 beyond them
    metrics: CoordinatorMetrics | None = None  # the coordinator's (shared with gRPC); None: a registry of its own
    gate: DrainGate | None = None  # the gRPC server's drain gate: HTTP requests count in its drain
    max_body_bytes: int = HTTP_MAX_BODY_BYTES  # larger request bodies: 413, unread
    allowed_origins: tuple[str, ...] = ()  # browser origins CORS admits ("*": any); empty: no CORS headers
    max_generations: int = HTTP_MAX_GENERATIONS  # choices generating at once; more wait in line (GenerationSlots)
    tool_call_parser: str | None = None  # how replies' tool calls are read (tool_calls.py); None: no tool calling

    @property
    def parses_tool_calls(self) -> bool:
        """Tools may be called, and conversations may hold calls and their results."""
        return self.tool_call_parser is not None


def error_response(
    status: int,
    message: str,
    kind: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorResponse(error=ErrorBody(message=message, type=kind, param=param, code=code))
    if status == 500:
        headers = {**(headers or {}), **NO_RETRY_HEADERS}
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def domain_error_response(exc: CalispecError) -> JSONResponse:
    status, kind = HTTP_ERRORS.get(exc.code, (500, "internal_error"))
    if status == 500:
        log.error("request failed: %s", exc)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None  # RFC 9110 §11.6.1: the scheme to use
    if (retry_after_s := getattr(exc, "retry_after_s", None)) is not None:  # RFC 9110 §10.2.3: whole seconds
        headers = {"Retry-After": str(math.ceil(retry_after_s))}
    message, param = str(exc), getattr(exc, "param", None)
    if isinstance(exc, InvalidField) and exc.field in CalispecParams.model_fields:  # the request's own field
        message, param = f"{exc.field}: {exc.reason}", exc.field  # as its schema's refusals read
    return error_response(status, message, kind, param, exc.code.lower(), headers)


def http_error_response(request: Request, exc: HTTPException, max_body_bytes: int) -> JSONResponse:
    """The framework's refusals in OpenAI's shape, their headers (405's `Allow`) kept."""
    kind, code = HTTP_STATUS_ERRORS.get(exc.status_code, ("invalid_request_error", None))
    message = str(exc.detail)
    if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI could not parse the body as JSON
        message = unparsable_body_message(exc.__cause__)
    elif exc.status_code == 404:
        message = f"no such endpoint: {request.url.path}"
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        message = f"{request.method} is not allowed on {request.url.path} (allowed: {allowed})"
    elif exc.status_code == 413:
        message = body_too_large_message(max_body_bytes)
    return error_response(exc.status_code, message, kind, code=code, headers=exc.headers)


def unparsable_body_message(cause: BaseException) -> str:
    if isinstance(cause, UnicodeDecodeError):
        return "the body is not valid JSON: it is not UTF-8 text"
    if isinstance(cause, RecursionError):
        return "the body is not valid JSON: it is nested too deeply"
    if isinstance(cause, ValueError) and "int_max_str_digits" in str(cause):  # Python's bound, not JSON's
        return f"the body holds an integer of more than {sys.get_int_max_str_digits()} digits, which no field takes"
    return f"the body is not valid JSON: {type(cause).__name__}: {cause}"


def body_too_large_message(max_body_bytes: int) -> str:
    return f"the request body is larger than this server's limit of {max_body_bytes} bytes"


def generation_params(
    req: CalispecParams, defaults: Defaults, max_tokens: int | None, choice: int = 0
) -> GenerationParams:
    """The request's parameters with the server's defaults applied (validated by the Orchestrator). `choice`: the
    place among its prompt's `n` choices; a seed gives it seed + choice (vLLM's rule: a batch of prompts samples
    each prompt as a request of its own would)."""
    seed = req.seed + choice if req.seed is not None else None
    return GenerationParams(
        max_new_tokens=max_tokens if max_tokens is not None else defaults.max_new_tokens,
        sampling=SamplingConfig(req.temperature, req.top_p, req.top_k, seed),
        stop=req.stop_strings(),
        num_speculative_tokens=req.gamma if req.gamma is not None else defaults.num_speculative_tokens,
        mode=Mode.parse(req.mode) if req.mode else defaults.mode,
        tau=req.tau if req.tau is not None else defaults.tau,
        lambda_=req.lambda_ if req.lambda_ is not None else defaults.lambda_,
        ignore_eos=req.ignore_eos,
        logprobs=req.requested_logprobs(),
        prompt_logprobs=req.requested_prompt_logprobs(),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        constraint=req.output_constraint(),
        rules=req.logit_rules(),
    )


def sse(payload: BaseModel | str) -> str:
    data = payload if isinstance(payload, str) else payload.model_dump_json()
    return f"data: {data}\n\n"


def as_sse(payload: BaseModel | str) -> str:
    """A stream's event: a model as one event, text as the events it already is."""
    return payload if isinstance(payload, str) else sse(payload)


class OpenAIApi:
    """The endpoints' logic; `create_app` wires it into FastAPI."""

    def __init__(self, orchestrator: Orchestrator, settings: ApiSettings) -> None:
        self.orchestrator = orchestrator
        self.settings = settings
        self.metrics = settings.metrics or CoordinatorMetrics(new_registry())
        self.gate = settings.gate or DrainGate(())
        self.started = int(time.time())  # the served model's `created`: the same on every call
        self.slots = GenerationSlots(settings.max_generations, self.metrics.http.slots_changed)
        self.stopping = threading.Event()  # the server is shutting down: streams end at their next chunk
        self.bounds = StreamBounds(self.slots, settings.request_timeout_s, self.stopping)
        # log-probabilities' token texts, decoded as the choices' texts are
        self.token_texts = TokenTexts(lambda ids: orchestrator.tokenizer.decode(ids, skip_special_tokens=True))
        # an echoed prompt's, decoded as its echoed text is (special tokens kept), so that its offsets follow that text
        self.prompt_token_texts = TokenTexts(lambda ids: orchestrator.tokenizer.decode(ids))

    def admit(self, request: Request, model: str, choices: int = 1, counted_by: str = "n") -> ExitStack:
        """Refuse while draining (503, as gRPC's UNAVAILABLE), name the caller (RequestGuard authenticated it
        before the body was read), check the model (404) and take a quota slot per choice (429); the drain counts
        the request and the quota slots stay taken until the returned stack is closed: by the endpoint, or by the
        stream when it ends."""
        if not self.gate.admit():
            raise Unavailable("the server is draining before shutdown; retry elsewhere")
        held = ExitStack()
        held.callback(self.gate.release)
        try:
            caller = self.caller(request)
            self.check_model(model)
            if self.settings.quotas is not None:
                held.enter_context(self.settings.quotas.admit(caller, choices, counted_by))
        except BaseException:
            held.close()
            raise
        return held

    def caller(self, request: Request) -> str:
        """The caller's name, as RequestGuard found it before the body was read (else from the headers now)."""
        name = request.scope.get(CALLER_SCOPE_KEY)
        return name if isinstance(name, str) else self.identify(request.headers, request.scope.get("client"))

    def identify(self, headers: Headers, client: tuple[str, int] | None) -> str:
        """The caller's API key's name (401 without a known one), or its address when the server is open."""
        keys = self.settings.keys
        if keys is None:
            return anonymous_caller(client[0] if client else "unknown")
        name = keys.identify(parse_bearer(headers.get("authorization")))
        if name is None:
            raise Unauthenticated("missing or unknown API key (send Authorization: Bearer <key>)")
        return name

    def unhealthy(self) -> str | None:
        """Why the server should get no traffic now, or None. Only states that end without traffic: a target
        replica's open circuit closes only when a request probes it, so it does not count here."""
        if self.gate.draining:
            return "the server is draining before shutdown"
        if len(self.orchestrator.replicas) == 0:
            return "no target replica is configured (the DNS name resolves to none)"
        return None

    def check_model(self, model: str) -> None:
        """404 unless `model` is the one this server serves."""
        if model != self.settings.model_name:
            raise ModelNotFound(f"the model {model!r} does not exist; this server serves {self.settings.model_name!r}")

    def model_card(self) -> ModelCard:
        return ModelCard(
            id=self.settings.model_name, created=self.started, max_model_len=self.orchestrator.context_length
        )

    def generations(
        self, prompts: Sequence[Callable[[], str | list[int]]], req: CalispecParams
    ) -> list[HttpGeneration]:
        """One generation per choice: `n` per prompt, choice k continuing prompt k // n."""
        return [self.chunks(prompt, req, choice) for prompt in prompts for choice in range(req.n)]

    def chunks(self, prompt: Callable[[], str | list[int]], req: CalispecParams, choice: int = 0) -> HttpGeneration:
        """The generation, lazily (nothing runs before the first `next`), with the per-request bookkeeping."""
        gone = threading.Event()

        def begin(timer: RequestTimer) -> Iterator[Chunk]:
            params = generation_params(req, self.settings.defaults, req.token_limit(), choice)
            timer.mode = params.mode.name.lower()
            deadline = Deadline(self.settings.request_timeout_s)
            fits = self.context_check(req)
            return self.orchestrator.generate(prompt(), params, deadline, gone.is_set, fits, timer.follow)

        return HttpGeneration(tracked(self.metrics, begin), gone, self.slots.rounds, self.step_out_of_lockstep)

    def step_out_of_lockstep(self, request_id: str) -> None:
        """A choice waiting for its siblings' first rounds leaves the lockstep group (HttpGeneration.step_aside)."""
        self.orchestrator.lockstep.leave(request_id)

    def context_check(self, req: CalispecParams) -> Callable[[int], None]:
        """The refusal (400, as vLLM's) of a prompt of so many tokens that it, or it plus the token limit the
        client sent, does not fit the context; the orchestrator would cut the completion short instead."""

        def check(prompt_tokens: int) -> None:
            limit = req.token_limit()
            message = context_overflow(prompt_tokens, limit, self.orchestrator.context_length)
            if message is not None:
                prompt_only = limit is None or prompt_tokens >= self.orchestrator.context_length
                raise InvalidParam(message, req.prompt_field if prompt_only else req.token_limit_field())

        return check

    def chat_logprobs(self, token_ids: list[int], logprobs: list[TokenLogprob] | None) -> ChatLogprobs | None:
        return None if logprobs is None else chat_logprobs(self.token_texts, token_ids, logprobs)

    def completion_logprobs(
        self, token_ids: list[int], logprobs: list[TokenLogprob] | None, offset: int = 0
    ) -> CompletionLogprobs | None:
        return None if logprobs is None else completion_logprobs(self.token_texts, token_ids, logprobs, offset)

    def completion_choice(self, req: CompletionRequest, index: int, outcome: Outcome) -> CompletionChoice:
        echo = self.echoed(req, index, outcome, first=True)
        return CompletionChoice(
            index=index,
            text=echo.text,
            finish_reason=openai_finish_reason(outcome.finish.finish_reason),
            token_ids=outcome.token_ids if req.return_token_ids else None,
            logprobs=echo.logprobs,
        )

    def echoed(self, req: CompletionRequest, index: int, part: Chunk | Outcome, first: bool, offset: int = 0) -> Echoed:
        """Choice `index`'s text and log-probabilities from `part` (a whole outcome, or a stream's chunk whose text
        starts at `offset`), after its prompt's when the request echoes and `part` is the choice's first."""
        if not (req.echo and first):
            return Echoed(part.text, self.completion_logprobs(part.token_ids, part.logprobs, offset))
        text = self.prompt_text(req.prompts()[index // req.n]) + part.text
        if part.prompt_token_ids is None:  # echo without log-probabilities
            return Echoed(text, None)
        head = prompt_logprobs(self.prompt_token_texts, part.prompt_token_ids, part.prompt_logprobs or [])
        tail = completion_logprobs(self.token_texts, part.token_ids, part.logprobs or [], end_offset(head, 0))
        return Echoed(text, joined(head, tail))

    def prompt_text(self, prompt: str | list[int]) -> str:
        """An echoed prompt: its text as sent, or its token ids decoded (special tokens kept: what the model read)."""
        return prompt if isinstance(prompt, str) else self.orchestrator.tokenizer.decode(prompt)

    def chat_prompt(self, req: ChatCompletionRequest) -> str:
        return render_messages(self.orchestrator.tokenizer, req, req.messages, self.settings.parses_tool_calls)

    def check_tools(self, req: ChatCompletionRequest) -> None:
        """Tools the model may call need a parser for its calls (vLLM: --enable-auto-tool-choice), unless the request
        forces a call: then its reply's structured output is the calls' JSON, and it may have no other."""
        if (forced := req.forced_call()) is not None:
            names = [tool["function"]["name"] for tool in req.tools or ()]
            if not names:
                raise InvalidParam("tool_choice forces a call: send the tools it may call", "tool_choice")
            if isinstance(forced, dict) and forced["function"]["name"] not in names:
                raise InvalidParam(
                    f"tool_choice names {forced['function']['name']!r}, not one of the tools", "tool_choice"
                )
            if CalispecParams.output_constraint(req) is not None:
                raise InvalidParam(
                    "tool_choice forces a call, whose JSON is the reply's structured output: send no other "
                    "(response_format, structured_outputs, guided_*)",
                    "tool_choice",
                )
            return
        if req.calls_tools() and not self.settings.parses_tool_calls:
            raise InvalidParam(
                "tools cannot be called: the coordinator was started without --tool-call-parser; send tool_choice "
                '"none" (the reply is then plain text), or leave tools out',
                "tools",
            )

    def chat_choice(self, req: ChatCompletionRequest, index: int, outcome: Outcome) -> ChatChoice:
        finish = openai_finish_reason(outcome.finish.finish_reason)
        message = AssistantMessage(content=outcome.text)
        if req.calls_tools():  # the reply read as a stream's last chunk reads it: one rule for both
            reader = self.call_stream(req)
            content = reader.feed(outcome.text)
            rest, calls = reader.finish()
            if calls:
                message = AssistantMessage(content=(content + rest) or None, tool_calls=[tool_call(c) for c in calls])
                finish = reader.finish_reason(finish)
        logprobs = self.chat_logprobs(outcome.token_ids, outcome.logprobs)
        return ChatChoice(index=index, message=message, finish_reason=finish, logprobs=logprobs)

    @staticmethod
    def call_stream(req: ChatCompletionRequest) -> ToolCallStream | ForcedCallStream:
        """How a streamed choice's calls are read: a forced call's JSON, or tags in the text."""
        forced = req.forced_call()
        return ForcedCallStream(forced) if forced is not None else ToolCallStream()

    async def completion(self, req: CompletionRequest, held: ExitStack, request: Request):
        generations = self.generations([lambda prompt=prompt: prompt for prompt in req.prompts()], req)
        rid, model, created = new_id("cmpl"), self.settings.model_name, now()  # one `created` for every chunk
        if not req.stream:
            with held:
                done = await self.whole_choices(generations, held, request)

            def response() -> CompletionResponse:  # on a worker thread: log-probabilities can be many objects
                choices = [self.completion_choice(req, index, outcome) for index, outcome in enumerate(done)]
                return CompletionResponse(
                    id=rid, created=created, model=model, choices=choices, usage=usage_of(done, req.n)
                )

            return await run_in_threadpool(response)

        offsets = [0] * len(generations)  # each choice's text so far, as its log-probabilities count it
        started = [False] * len(generations)  # each choice's first event sent (it carries an echoed prompt)

        def event(index: int, chunk: Chunk) -> CompletionResponse:
            ids = chunk.token_ids if req.return_token_ids else None
            echo = self.echoed(req, index, chunk, not started[index], offsets[index])
            started[index] = True
            if echo.logprobs is not None:
                offsets[index] = end_offset(echo.logprobs, offsets[index])
            choice = CompletionChoice(
                index=index,
                text=echo.text,
                finish_reason=openai_finish_reason(chunk.finish_reason),
                token_ids=ids,
                logprobs=echo.logprobs,
            )
            return CompletionResponse(id=rid, created=created, model=model, choices=[choice])

        def usage_event(usage: Usage) -> CompletionResponse:
            return CompletionResponse(id=rid, created=created, model=model, choices=[], usage=usage)

        usage = usage_event if req.include_usage_chunk else None
        return await stream(generations, req.n, held, [], event, usage, request, self.bounds)

    async def whole_choices(
        self, generations: Sequence[HttpGeneration], held: ExitStack, request: Request
    ) -> list[Outcome]:
        """A unary request's choices, whole, once they have their slots (waiting as a stream's do: `self.bounds`)."""
        held.callback(await admitted(self.bounds.slots, generations, request, self.bounds.timeout_s))
        return await gathered(generations, request, self.bounds.stopping)

    async def chat_completion(self, req: ChatCompletionRequest, held: ExitStack, request: Request):
        self.check_tools(req)
        generations = self.generations([cache(partial(self.chat_prompt, req))], req)  # rendered once
        rid, model, created = new_id("chatcmpl"), self.settings.model_name, now()  # one `created` for every chunk
        if not req.stream:
            with held:
                done = await self.whole_choices(generations, held, request)

            def response() -> ChatCompletionResponse:  # on a worker thread: log-probabilities can be many objects
                choices = [self.chat_choice(req, index, outcome) for index, outcome in enumerate(done)]
                return ChatCompletionResponse(
                    id=rid, created=created, model=model, choices=choices, usage=usage_of(done, req.n)
                )

            return await run_in_threadpool(response)

        call_streams = {i: self.call_stream(req) for i in range(len(generations))} if req.calls_tools() else {}

        def event(index: int, chunk: Chunk) -> ChatCompletionChunk:
            delta, finish = chat_delta(chunk, call_streams.get(index))
            choice = ChatChunkChoice(
                index=index,
                delta=delta,
                finish_reason=finish,
                logprobs=self.chat_logprobs(chunk.token_ids, chunk.logprobs),
            )
            return ChatCompletionChunk(id=rid, created=created, model=model, choices=[choice])

        def usage_event(usage: Usage) -> ChatCompletionChunk:
            return ChatCompletionChunk(id=rid, created=created, model=model, choices=[], usage=usage)

        opening = [  # each choice's first event names its role, as vLLM's
            ChatCompletionChunk(
                id=rid,
                created=created,
                model=model,
                choices=[ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))],
            )
            for i in range(len(generations))
        ]
        usage = usage_event if req.include_usage_chunk else None
        return await stream(generations, req.n, held, opening, event, usage, request, self.bounds)

    async def response(self, req: ResponsesRequest, form: ChatForm, held: ExitStack, request: Request):
        """A Responses API request, served as the chat completion `form` it asks for (coordinator.openai_responses)."""
        chat = form.chat
        self.check_tools(chat)

        @cache  # rendered once
        def prompt() -> str:
            try:
                return self.chat_prompt(chat)
            except InvalidParam as exc:  # it names the chat request's messages: name the input items instead
                raise form.refusal(exc) from None

        generations = self.generations([prompt], chat)
        opened = ResponseObject.opened(req, chat, self.settings.model_name)
        if not req.stream:
            with held:
                done = await self.whole_choices(generations, held, request)

            def response() -> ResponseObject:  # on a worker thread: log-probabilities can be many objects
                choice, cut_short = self.chat_choice(chat, 0, done[0]), cut_short_by(done[0].finish)
                status = "incomplete" if cut_short else "completed"
                calls = choice.message.tool_calls or []
                items = output_items(choice.message.content, calls, choice.logprobs, status)
                return opened.finished(items, usage_of(done, 1), cut_short)

            return await run_in_threadpool(response)

        events, call_stream = ResponseEvents(opened), self.call_stream(chat) if chat.calls_tools() else None
        written = [0]  # the reply's tokens so far

        def event(index: int, chunk: Chunk) -> str:
            written[0] += len(chunk.token_ids)
            delta, _ = chat_delta(chunk, call_stream)
            sent = events.text(delta.content or "", self.chat_logprobs(chunk.token_ids, chunk.logprobs))
            if chunk.finish_reason is not None and chunk.stats is not None:
                usage = Usage.of(chunk.stats.prompt_tokens, written[0])
                sent += events.closing(delta.tool_calls or [], usage, cut_short_by(chunk))
            return response_sse(sent) or KEEP_ALIVE  # proxies and clients time out silent streams

        def failure(exc: CalispecError) -> str:
            return response_sse(events.failure(exc.code.lower(), str(exc)))

        opening = [response_sse(events.opening())]
        ending = StreamEnding(failure, "")  # OpenAI ends a Response's stream with its last event: no [DONE]
        return await stream(generations, 1, held, opening, event, None, request, self.bounds, ending)


def cut_short_by(chunk: Chunk) -> bool:
    """The reply ran into its token limit (or the context's end): a Response is then "incomplete"."""
    return chunk.finish_reason == FinishReason.LENGTH


def tool_call(call: ParsedCall) -> ToolCall:
    return ToolCall(id=call.id, function=FunctionCall(name=call.name, arguments=call.arguments))


def delta_tool_call(call: ParsedCall, index: int) -> DeltaToolCall:
    return DeltaToolCall(index=index, id=call.id, function=FunctionCall(name=call.name, arguments=call.arguments))


def chat_delta(
    chunk: Chunk, call_stream: ToolCallStream | ForcedCallStream | None
) -> tuple[ChatDelta, ChatFinish | None]:
    """A streamed chunk's delta and finish reason; with `call_stream` (the request's tools may be called), its text goes
    through them: what may start a call is held back, and the calls go out whole with the choice's last chunk."""
    finish: ChatFinish | None = openai_finish_reason(chunk.finish_reason)
    if call_stream is None:
        return (ChatDelta(content=chunk.text) if chunk.text or finish is None else ChatDelta()), finish
    text = call_stream.feed(chunk.text)
    if finish is None:
        return ChatDelta(content=text), None
    rest, parsed = call_stream.finish()
    text += rest
    if not parsed:
        return (ChatDelta(content=text) if text else ChatDelta()), finish
    deltas = [delta_tool_call(call, i) for i, call in enumerate(parsed)]
    return ChatDelta(content=text or None, tool_calls=deltas), call_stream.finish_reason(finish)


@dataclass(frozen=True)
class StreamBounds:
    """What bounds a stream besides its request: the API's generation slots, its requests' timeout (the line's
    wait, and the stream's own plus CANCEL_GRACE_S) and its shutdown (set: streams end at their next chunk)."""

    slots: GenerationSlots
    timeout_s: float
    stopping: threading.Event


class ModelNotFound(NotFound):
    param = "model"


@dataclass(frozen=True)
class StreamEnding:
    """How a stream ends: a failure's event, and the text after the last event (chat and completions: OpenAI's error
    body, then `data: [DONE]`)."""

    failure: Callable[[CalispecError], str]
    done: str


def failure_event(exc: CalispecError) -> str:
    kind = HTTP_ERRORS.get(exc.code, (500, "internal_error"))[1]
    return sse(ErrorResponse(error=ErrorBody(message=str(exc), type=kind, code=exc.code.lower())))


CHOICES_ENDING = StreamEnding(failure_event, sse("[DONE]"))


async def stream(
    generations: Sequence[HttpGeneration],
    n: int,
    held: ExitStack,
    opening: Sequence[BaseModel | str],
    event: Callable[[int, Chunk], BaseModel | str],
    usage_event: Callable[[Usage], BaseModel] | None,
    request: Request | None = None,
    bounds: StreamBounds | None = None,
    ending: StreamEnding = CHOICES_ENDING,
) -> StreamingResponse | JSONResponse:
    """Server-sent events, each choice's as its rounds end. Every choice's first round runs before the response
    starts, so that a bad request still gets its HTTP error status; a failure later arrives as an `error` event
    (and ends the other choices). The usage event, when asked for, follows the last choice's end: each prompt's
    tokens once (choice k continues prompt k // n), every choice's new tokens. With `request`, a client that leaves
    before the first events ends them. With `bounds`, the choices first wait for their slots (at most the timeout);
    the timeout (+ CANCEL_GRACE_S) also bounds the stream: a client that stops reading without leaving held its
    generation slots, quota slots and drain count for as long as its connection lived; once `stopping` is set (the
    server shuts down after its drain), the stream ends at its next chunk with an UNAVAILABLE error event: it was cut
    mid-body when the server's grace ran out. `opening` and `event` give models (each one event) or server-sent
    events' text as it is sent; `ending` how the stream ends."""
    for generation in generations:
        held.callback(generation.abandon)  # however the response ends (a no-op once the generation finished)
    try:
        if bounds is not None:
            held.callback(await admitted(bounds.slots, generations, request, bounds.timeout_s))
        firsts = await first_chunks(generations, request)
    except CalispecError as exc:
        held.close()
        return domain_error_response(exc)

    async def events() -> AsyncIterator[str]:
        with held:
            async for event_text in _events():
                yield event_text

    def event_text(index: int, chunk: Chunk) -> str:
        return as_sse(event(index, chunk))

    async def _events() -> AsyncIterator[str]:
        for message in opening:
            yield as_sse(message)
        prompt_tokens = completion_tokens = 0
        try:
            async for index, chunk in merged(firsts, generations):
                completion_tokens += len(chunk.token_ids)
                if chunk.prompt_logprobs:  # an echoed prompt's entries, maybe thousands: built off the event loop
                    yield await run_in_threadpool(event_text, index, chunk)
                elif text := event_text(index, chunk):  # a Response's chunk of held-back text has no event
                    yield text
                if chunk.finish_reason is not None and chunk.stats is not None and index % n == 0:
                    prompt_tokens += chunk.stats.prompt_tokens
                if bounds is not None and bounds.stopping.is_set() and chunk.finish_reason is None:  # none lost
                    raise Unavailable("the server is shutting down: this stream ends here; retry elsewhere")
            if usage_event is not None:
                yield sse(usage_event(Usage.of(prompt_tokens, completion_tokens)))
        except CalispecError as exc:
            yield ending.failure(exc)
        if ending.done:
            yield ending.done

    let_go_s = None if bounds is None else bounds.timeout_s + CANCEL_GRACE_S
    return OwnedStream(events(), held.close, let_go_s, media_type="text/event-stream", headers=SSE_HEADERS)


class OwnedStream(StreamingResponse):
    """A stream that gives back what it holds (its drain, quota and generation slots, its generations) however the
    response ends: also when the client leaves before the first byte, where the body's generator never starts and
    its own `with` never runs (closing twice is harmless), and `let_go_s` after it starts even if a send still
    waits for a client that stopped reading (the connection stays until the client reads or leaves: closing it
    from here would end the ASGI call without its response, an error in uvicorn's log)."""

    def __init__(
        self, content: AsyncIterator[str], release: Callable[[], object], let_go_s: float | None, **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self._release = release
        self._let_go_s = let_go_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        failure: Exception | None = None
        try:
            async with anyio.create_task_group() as group:
                if self._let_go_s is not None:
                    group.start_soon(self._let_go_after, self._let_go_s)
                try:
                    await super().__call__(scope, receive, send)
                except Exception as exc:  # raised below as itself (a ClientDisconnect), not in an ExceptionGroup
                    failure = exc
                group.cancel_scope.cancel()
        finally:
            self._release()
        if failure is not None:
            raise failure

    async def _let_go_after(self, seconds: float) -> None:
        await anyio.sleep(seconds)  # a deadline, not a synchronisation: the generations' own ended before it
        self._release()


class RequestIdMiddleware:
    """Binds the caller's `X-Request-Id` (or a new one) for the request, as the gRPC interceptor does
    for `x-request-id` metadata, and echoes it in the response headers. Plain ASGI, so that the id
    reaches the streamed body and the thread pool (both run in copies of this context)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = sanitize(Headers(scope=scope).get(REQUEST_ID_METADATA)) or new_request_id()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[REQUEST_ID_METADATA] = request_id
            await send(message)

        with bound_request_id(request_id):
            await self.app(scope, receive, send_with_id)


class RequestGuard:
    """What is checked before the app reads a byte of the body, so that a caller without a key, or a body
    over the limit, costs no memory: the API key (401; `/health` is exempt), the declared size
    (`Content-Length` over the limit: 413), and for the JSON endpoints the body's media type and coding
    (400 unless `application/json`, uncompressed). A body without a `Content-Length` (chunked) is counted as
    it is read, by the routes' `max_body_size` (413 once past the limit)."""

    def __init__(self, app: ASGIApp, api: OpenAIApi) -> None:
        self.app = app
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # `/health/` too: its redirect to `/health` needs no key either (it was a 401; found by probing)
        if scope["type"] != "http" or scope["path"] in (HEALTH_PATH, HEALTH_PATH + "/"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            scope[CALLER_SCOPE_KEY] = self.api.identify(headers, scope.get("client"))
        except Unauthenticated as exc:
            await domain_error_response(exc)(scope, receive, send)
            return
        refusal = self.refusal(scope, headers)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope, headers: Headers) -> JSONResponse | None:
        limit = self.api.settings.max_body_bytes
        try:
            declared = int(headers.get("content-length", "0"))
        except ValueError:  # the server refuses a malformed Content-Length before the app is called
            declared = 0
        if declared > limit:
            return guard_error(413, body_too_large_message(limit))
        if scope["method"] != "POST" or scope["path"] not in JSON_BODY_PATHS:
            return None
        media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":  # FastAPI would take such a body as bytes: a baffling 400
            shown = f"got {media_type!r}" if media_type else "none was sent"
            message = f"Content-Type must be application/json ({shown})"
            return guard_error(400, message)
        coding = headers.get("content-encoding", "identity").strip().lower()
        if coding not in ("", "identity"):
            message = f"Content-Encoding {coding!r} is not supported: send the body uncompressed"
            return guard_error(400, message, {"Accept-Encoding": "identity"})
        return None


def guard_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    kind, code = HTTP_STATUS_ERRORS[status]
    return error_response(status, message, kind, code=code, headers=headers)


def instrument(app: FastAPI, metrics: CoordinatorMetrics) -> None:
    """Count every response by route template (unknown paths: `none`), method and exact status, and time it to
    its last byte, as vLLM does (prometheus-fastapi-instrumentator), on the coordinator's registry."""
    # scrapes of /metrics are not requests to the API (vLLM leaves them out too)
    instrumentator = Instrumentator(
        should_group_status_codes=False, excluded_handlers=[f"^{METRICS_PATH}$"], registry=metrics.registry
    )
    instrumentator.add(metrics.http.observe).instrument(app)


def create_app(orchestrator: Orchestrator, settings: ApiSettings) -> FastAPI:
    api = OpenAIApi(orchestrator, settings)
    app = FastAPI(title="Calispec (OpenAI-compatible)", docs_url=None, redoc_url=None)
    app.state.api = api  # its shutdown event (serve_http) and generation slots
    app.add_middleware(RequestGuard, api=api)  # inside RequestIdMiddleware: its refusals carry the request id
    app.add_middleware(RequestIdMiddleware)
    if settings.allowed_origins:  # outermost: a browser's preflight carries no API key, and refusals need the headers
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.allowed_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "x-request-id"],
            expose_headers=["x-request-id", "retry-after", "x-should-retry"],  # what a browser's SDK reads to retry
        )
    instrument(app, api.metrics)  # added last: outermost, it sees every answer, CORS's and RequestGuard's too

    @app.exception_handler(CalispecError)
    async def _domain(request: Request, exc: CalispecError) -> JSONResponse:
        return domain_error_response(exc)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s", request.url.path)  # a bug, as INTERNAL is on gRPC
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}", "internal_error")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":  # its loc is a character offset, not a field
            detail = first.get("ctx", {}).get("error", "")
            message = f"the body is not valid JSON: {detail} at character {first.get('loc', ('', '?'))[-1]}"
            return error_response(400, message, "invalid_request_error", None, "invalid_argument")
        message, param = validation_error(first)  # messages[0].content, not messages.0.content
        return error_response(400, message, "invalid_request_error", param, "invalid_argument")

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        return http_error_response(request, exc, settings.max_body_bytes)

    @app.get(HEALTH_PATH, include_in_schema=False)
    async def health() -> Response:
        reason = api.unhealthy()
        if reason is not None:
            return error_response(503, reason, "service_unavailable", code="unavailable")
        return Response(status_code=200)

    @app.get(METRICS_PATH, include_in_schema=False)
    def metrics(request: Request) -> Response:  # a thread of Starlette's pool: encoding stays off the event loop
        api.caller(request)  # behind the API keys (vLLM's answers anyone): a scrape config sends one as a bearer token
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(api.metrics.registry), media_type=content_type)

    @app.get(VERSION_PATH)
    async def version(request: Request) -> dict[str, str]:
        api.caller(request)  # behind the API keys, as /v1/models is (vLLM's answers anyone)
        return {"version": calispec.__version__}

    @app.get("/v1/models")
    async def models(request: Request) -> ModelList:
        api.caller(request)
        return ModelList(data=[api.model_card()])

    @app.get("/v1/models/{model_id:path}", response_model=None)
    async def model(model_id: str, request: Request) -> ModelCard | RedirectResponse:
        api.caller(request)
        if not model_id:  # `/v1/models/`, the list's twin: redirected as the other routes' are (it was a 404)
            return RedirectResponse(request.url.replace(path=request.url.path.rstrip("/")), status_code=307)
        api.check_model(model_id)
        return api.model_card()

    @app.post(COMPLETIONS_PATH, response_model=None, max_body_size=settings.max_body_bytes)
    async def completions(body: CompletionRequest, request: Request):
        # a list of prompts is as many requests as an `n` (a 400 over the quota names the field that asked)
        held = api.admit(request, body.model, body.choice_count(), "n" if body.n > 1 else "prompt")
        try:
            return await api.completion(body, held, request)
        except BaseException:
            held.close()  # a stream that started owns its slot; anything that failed before gives it back
            raise

    @app.post(CHAT_PATH, response_model=None, max_body_size=settings.max_body_bytes)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        held = api.admit(request, body.model, body.choice_count())
        try:
            return await api.chat_completion(body, held, request)
        except BaseException:
            held.close()
            raise

    @app.post(RESPONSES_PATH, response_model=None, max_body_size=settings.max_body_bytes)
    async def responses(body: ResponsesRequest, request: Request):
        form = body.chat_request()  # its refusals before admission, as a chat request's schema refusals are
        held = api.admit(request, body.model)
        try:
            return await api.response(body, form, held, request)
        except BaseException:
            held.close()
            raise

    add_tokenizer_routes(app, api)
    return app


def add_tokenizer_routes(app: FastAPI, api: OpenAIApi) -> None:
    """vLLM's `/tokenize`, `/detokenize` and `/tokenizer_info` (coordinator.openai_tokenizer), behind the same API
    keys; no quota (nothing is generated). Tokenizing a long prompt is CPU work: off the event loop, on threads of
    its own (TOKENIZER_THREADS at once), so that many such calls never take the threads generations run on."""
    max_body = api.settings.max_body_bytes
    limiter = anyio.CapacityLimiter(TOKENIZER_THREADS)

    async def off_loop(work: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(work, *args, limiter=limiter)

    def check(request: Request, model: str | None) -> None:
        api.caller(request)
        if model is not None:
            api.check_model(model)

    @app.post(TOKENIZE_PATH, max_body_size=max_body)
    async def tokenize_route(body: TokenizeRequest, request: Request) -> TokenizeResponse:
        check(request, body.model)
        parses = api.settings.parses_tool_calls
        return await off_loop(tokenize, api.orchestrator.tokenizer, body, api.orchestrator.context_length, parses)

    @app.post(DETOKENIZE_PATH, max_body_size=max_body)
    async def detokenize_route(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
        check(request, body.model)
        return await off_loop(detokenize, api.orchestrator.tokenizer, body, api.orchestrator.context_length)

    @app.get(TOKENIZER_INFO_PATH)
    async def tokenizer_info_route(request: Request) -> TokenizerInfo:
        check(request, None)
        return tokenizer_info(api.orchestrator.tokenizer, api.orchestrator.context_length)


@dataclass
class HttpServer:
    server: uvicorn.Server
    thread: threading.Thread
    port: int
    stopping: threading.Event | None = None  # the API's: its streams end at their next chunk with an error event

    def begin_stop(self) -> None:
        """Stop taking connections and let the streams end (uvicorn's grace: 5 s, then what runs is cancelled).
        The coordinator calls it before its gRPC server's grace, so that both graces run at once: one after the
        other made it exit 10 s past its drain, not 5 (found by probing, wave 50)."""
        if self.stopping is not None:
            self.stopping.set()
        self.server.should_exit = True

    def stop(self, timeout_s: float = 5.0) -> None:
        self.begin_stop()
        self.thread.join(timeout_s)


def serve_http(
    orchestrator: Orchestrator,
    config: CoordinatorConfig,
    keys: ApiKeys | None,
    quotas: QuotaBook | None,
    metrics: CoordinatorMetrics | None = None,
    gate: DrainGate | None = None,
) -> HttpServer:
    """The HTTP API of a coordinator process, next to its gRPC server: same keys, same quotas, same TLS
    certificate (server-side; HTTP clients authenticate with API keys), same metrics, same drain."""
    app = create_app(orchestrator, api_settings(config, keys, quotas, metrics, gate))
    http = start_http_server(app, config.host, config.http_port or 0, config.tls, config.http_header_timeout_s)
    http.stopping = app.state.api.stopping
    return http


def api_settings(
    config: CoordinatorConfig,
    keys: ApiKeys | None,
    quotas: QuotaBook | None,
    metrics: CoordinatorMetrics | None = None,
    gate: DrainGate | None = None,
) -> ApiSettings:
    """The HTTP API's settings from the coordinator's config (and what it shares with the gRPC server)."""
    return ApiSettings(
        config.model_name,
        config.defaults,
        config.rpc_timeout_s,
        keys,
        quotas,
        metrics,
        gate,
        config.http_max_body_bytes,
        config.http_allowed_origins,
        config.http_max_generations,
        config.tool_call_parser,
    )


def start_http_server(
    app: FastAPI,
    host: str,
    port: int,
    tls: TlsConfig | None = None,
    header_timeout_s: float = HTTP_HEADER_TIMEOUT_S,
) -> HttpServer:
    """Serve `app` on host:port (0: a free port) in a background thread; returns once bound. A connection's
    request headers (and TLS handshake) must be in within `header_timeout_s` (coordinator.http_transport)."""
    sock = socket.create_server((host, port))  # bound here so that the port is known now
    files = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)} if tls and tls.enabled else {}
    protocol: Any = guarded_protocol(header_timeout_s)  # uvicorn's `http` takes any protocol factory
    config = uvicorn.Config(
        app, http=protocol, log_level="warning", lifespan="off", timeout_graceful_shutdown=5, **files
    )
    server = uvicorn.Server(config)
    target = partial(serve, server, sock, header_timeout_s)
    thread = threading.Thread(target=target, daemon=True, name="openai-http")
    thread.start()
    return HttpServer(server, thread, sock.getsockname()[1])

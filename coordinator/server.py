"""gRPC servicer for the public API: protobuf -> Orchestrator -> protobuf."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerBase

from calispec.v1 import coordinator_pb2, coordinator_pb2_grpc
from calispec_core.access import ApiKeyInterceptor, ApiKeys, QuotaBook, QuotaInterceptor
from calispec_core.credentials import is_loopback
from calispec_core.errors import CalispecError, DeadlineExceeded, FailedPrecondition
from calispec_core.generation import (
    Defaults,
    GenerationParams,
    GenerationStats,
    constraint_from_wire,
    mode_from_wire,
)
from calispec_core.grpc_server import create_grpc_server, wait_for_ready
from calispec_core.logit_rules import rules_from_wire
from calispec_core.metrics import new_registry
from calispec_core.modeling import load_tokenizer, tokenizer_fingerprint
from calispec_core.observability import ManagedServer, Observe, ended_by_deadline
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Deadline
from coordinator.backends import ModelFacts
from coordinator.chat import ChatTurn, render_chat
from coordinator.circuit import CircuitBreaker
from coordinator.clients import GrpcDraftBackend, GrpcTargetBackend
from coordinator.config import CANCEL_GRACE_S, GRPC_MAX_REQUEST_BYTES, CoordinatorConfig
from coordinator.cost_model import CostModel
from coordinator.discovery import DnsReplicaWatcher, replica_addresses
from coordinator.engine import Chunk, Orchestrator, SpeculationConfig
from coordinator.metrics import CoordinatorMetrics, RequestTimer
from coordinator.replicas import ReplicaSet, checked_connector
from coordinator.request_log import tracked

log = logging.getLogger(__name__)
SERVICE_NAME = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"].full_name
# gRPC servers report a call without a deadline as ~9.2e18 s remaining; anything this long is "none"
NO_CLIENT_DEADLINE_S = 1e9


def request_timeout(client_remaining: float | None, default_s: float) -> float:
    """The client's deadline when it set one (shorter or longer than the default), else `default_s`."""
    if client_remaining is None or client_remaining >= NO_CLIENT_DEADLINE_S:
        return default_s
    return client_remaining


def call_gone(context: grpc.ServicerContext) -> bool:
    """Whether the call ended under its request (the orchestrator stops at its next round). gRPC also ends a call
    at the client's deadline, a moment before the request's own `Deadline` (made a little later) runs out: that end
    is the deadline's (DEADLINE_EXCEEDED, as the client sees it), not a cancel, for the metrics and the log."""
    if context.is_active():
        return False
    if ended_by_deadline(context):  # within the slack: the client's cancel at its own deadline
        raise DeadlineExceeded("deadline exceeded")
    return True


def params_from_pb(msg: coordinator_pb2.GenerationParams, defaults: Defaults) -> GenerationParams:
    """Apply server defaults to unset fields; validation happens in the orchestrator."""
    sampling = SamplingConfig(msg.temperature, msg.top_p, msg.top_k, msg.seed if msg.HasField("seed") else None)
    return GenerationParams(
        max_new_tokens=msg.max_new_tokens or defaults.max_new_tokens,
        sampling=sampling,
        stop=tuple(msg.stop),
        num_speculative_tokens=(  # None: adaptive
            msg.num_speculative_tokens if msg.HasField("num_speculative_tokens") else defaults.num_speculative_tokens
        ),
        mode=mode_from_wire(msg.mode, defaults.mode),
        tau=msg.tau if msg.HasField("tau") else defaults.tau,
        lambda_=msg.lambda_ if msg.HasField("lambda_") else defaults.lambda_,
        ignore_eos=msg.ignore_eos,
        logprobs=msg.logprobs if msg.HasField("logprobs") else None,
        prompt_logprobs=msg.prompt_logprobs if msg.HasField("prompt_logprobs") else None,
        stop_token_ids=tuple(msg.stop_token_ids),
        constraint=constraint_from_wire(msg.constraint, msg.HasField("constraint")),
        rules=rules_from_wire(msg.rules, msg.HasField("rules"), from_client=True),
    )


def stats_to_pb(stats: GenerationStats) -> coordinator_pb2.GenerationStats:
    return coordinator_pb2.GenerationStats(**stats.to_dict())


def chunk_to_pb(chunk: Chunk) -> coordinator_pb2.GenerateStreamResponse:
    msg = coordinator_pb2.GenerateStreamResponse(
        text=chunk.text, token_ids=chunk.token_ids, request_id=chunk.request_id
    )
    if chunk.finish_reason is not None:
        msg.finish_reason = int(chunk.finish_reason)
    if chunk.stats is not None:
        msg.stats.CopyFrom(stats_to_pb(chunk.stats))
    msg.logprobs.extend(lp.to_pb() for lp in chunk.logprobs or ())
    add_prompt_report(msg, chunk)
    return msg


def add_prompt_report(
    msg: coordinator_pb2.GenerateResponse | coordinator_pb2.GenerateStreamResponse, chunk: Chunk
) -> None:
    """The prompt's ids and log-probabilities, on a request's first chunk when it asked for them."""
    msg.prompt_token_ids.extend(chunk.prompt_token_ids or ())
    msg.prompt_logprobs.extend(lp.to_pb() for lp in chunk.prompt_logprobs or ())


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServicer):
    def __init__(
        self, orchestrator: Orchestrator, config: CoordinatorConfig, metrics: CoordinatorMetrics | None = None
    ) -> None:
        self.orchestrator = orchestrator
        self.config = config
        self.metrics = metrics or CoordinatorMetrics(new_registry())  # a registry of its own

    def _chunks(self, request, context) -> Iterator[Chunk]:
        """The orchestrator's chunks, timed, counted and logged (`coordinator.request_log`). The call is
        cancelled a moment past its deadline: a client that stops reading a stream blocks this worker thread
        in gRPC's send, where no round checks the deadline (32 unread streams held every worker for good)."""
        timeout_s = request_timeout(context.time_remaining(), self.config.rpc_timeout_s)

        def begin(timer: RequestTimer) -> Iterator[Chunk]:
            params = params_from_pb(request.params, self.config.defaults)
            timer.mode = params.mode.name.lower()
            prompt = self._prompt(request)
            return self.orchestrator.generate(
                prompt, params, Deadline(timeout_s), lambda: call_gone(context), on_start=timer.follow
            )

        watchdog = threading.Timer(timeout_s + CANCEL_GRACE_S, context.cancel)
        watchdog.daemon = True
        watchdog.start()
        try:
            yield from tracked(self.metrics, begin)
        finally:
            watchdog.cancel()

    def _prompt(self, request) -> str | list[int]:
        """The raw prompt, its token ids, or the chat messages rendered with the target's chat template."""
        given = request.WhichOneof("input")
        if given == "messages":
            turns = [ChatTurn(m.role, m.content) for m in request.messages.messages]
            return render_chat(self.orchestrator.tokenizer, turns)
        if given == "prompt_token_ids":
            return list(request.prompt_token_ids.ids)
        return request.prompt

    def Generate(self, request, context):
        response = coordinator_pb2.GenerateResponse()
        for chunk in self._chunks(request, context):
            response.token_ids.extend(chunk.token_ids)
            response.text += chunk.text
            response.logprobs.extend(lp.to_pb() for lp in chunk.logprobs or ())
            add_prompt_report(response, chunk)
            response.request_id = chunk.request_id
            if chunk.finish_reason is not None:
                response.finish_reason = int(chunk.finish_reason)
                response.stats.CopyFrom(stats_to_pb(chunk.stats))
        return response

    def GenerateStream(self, request, context):
        for chunk in self._chunks(request, context):
            yield chunk_to_pb(chunk)


def _check_pair(draft: ModelFacts, target: ModelFacts, local_fingerprint: str) -> None:
    """Refuse a draft/target pair that does not share one tokenizer: token ids would not mean the same."""
    if draft.tokenizer_fingerprint != target.tokenizer_fingerprint:
        raise FailedPrecondition(
            f"draft {draft.model_id!r} and target {target.model_id!r} use different tokenizers "
            f"({draft.tokenizer_fingerprint[:12]} != {target.tokenizer_fingerprint[:12]}); "
            "speculative decoding needs a pair that shares one"
        )
    if local_fingerprint != target.tokenizer_fingerprint:
        raise FailedPrecondition("the coordinator's --tokenizer differs from the target model's tokenizer")


def _initial_target_addresses(config: CoordinatorConfig) -> list[str]:
    """The fixed replicas, or what --target-dns resolves to now (retried until connect_timeout_s)."""
    if config.target_dns is None:
        return list(config.target_addresses)
    deadline = Deadline(config.connect_timeout_s)
    while True:
        try:
            addresses = replica_addresses(config.target_dns)
            if addresses:
                return addresses
        except OSError as exc:
            log.info("waiting for %s to resolve: %s", config.target_dns, exc)
        try:
            time.sleep(min(1.0, deadline.remaining()))  # start-up wait for DNS, not test synchronisation
        except DeadlineExceeded as exc:
            raise CalispecError(f"{config.target_dns} did not resolve within {config.connect_timeout_s}s") from exc


def build_orchestrator(config: CoordinatorConfig) -> Orchestrator:
    """Connect to the model services (waiting up to connect_timeout_s) and check the pair."""
    tokenizer = _tokenizer(config.tokenizer)  # first: a bad path fails at once, not after the wait
    draft = GrpcDraftBackend(config.draft_address, config.tls)
    targets = [GrpcTargetBackend(a, config.tls) for a in _initial_target_addresses(config)]
    for backend in [draft, *targets]:
        try:
            wait_for_ready(backend.channel, config.connect_timeout_s)
        except grpc.FutureTimeoutError as exc:
            raise CalispecError(f"no service at {backend.address} after {config.connect_timeout_s}s") from exc
    draft_facts = draft.info(config.rpc_timeout_s)
    target_facts = [t.info(config.rpc_timeout_s) for t in targets]
    for facts in target_facts:
        _check_pair(draft_facts, facts, tokenizer_fingerprint(tokenizer))
    max_context = min([draft_facts.max_context, *(f.max_context for f in target_facts)])
    replicas = ReplicaSet(targets)
    if config.target_dns is not None:
        connect = checked_connector(target_facts[0], config.connect_timeout_s, config.tls)
        DnsReplicaWatcher(config.target_dns, replicas, connect, config.target_refresh_s).start()
    circuit = CircuitBreaker(max_backoff_s=config.draft_max_backoff_s)
    costs = CostModel.from_measured(target_facts[0].forward_costs, draft_facts.forward_costs)
    policy = SpeculationConfig(
        config.max_gamma,
        config.draft_min_confidence,
        draft_min_path_confidence=config.draft_min_path_confidence,
        draft_to_floor=config.draft_to_floor,
        lockstep_wait_s=config.lockstep_wait_s,
        lockstep_phase=config.lockstep_phase,
    )
    return Orchestrator(
        tokenizer,
        draft,
        replicas,
        target_facts[0].eos_token_ids,
        max_context,
        circuit,
        config.draft_timeout_s,
        costs=costs,
        speculation=policy,
        vocab_size=min(draft_facts.vocab_size, *(f.vocab_size for f in target_facts)),
    )


def _tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The tokenizer of `path`, or an error naming it (Hugging Face reads a missing directory as a Hub repo id)."""
    if not path.is_dir():
        raise FailedPrecondition(f"cannot load the tokenizer: {path} is not a directory")
    try:
        tokenizer = load_tokenizer(path)
    except (OSError, ValueError) as exc:  # what transformers raises for a directory without a tokenizer
        raise FailedPrecondition(f"cannot load the tokenizer in {path}: {exc}") from exc
    without_word_cache(tokenizer)
    return tokenizer


def without_word_cache(tokenizer: PreTrainedTokenizerBase) -> None:
    """Turn off the BPE model's word cache (a no-op for other models). Since tokenizers 0.23 each thread that
    encodes keeps a cache of its own, of up to 10,000 words; the coordinator encodes its prompts on many worker
    threads (the HTTP API's rounds, its /tokenize calls, the gRPC handlers), so with varied prompts each could fill
    one, and what the caches of ended threads free stays with glibc (8 threads that each encoded 12,000 distinct
    words: +34.5 MB, +0.5 MB without the cache). Uncached, a prompt's words are merged at each encode, once per
    request: ~0.5 ms more for 668 tokens of the shipped pair's tokenizer (docs/robustness.md)."""
    model = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)  # None: a slow tokenizer
    resize = getattr(model, "_resize_cache", None)  # tokenizers 0.21-0.23 (private: a later one may drop it)
    if isinstance(model, BPE) and resize is not None:  # (Unigram's cache is one for all threads, of 10,000 entries)
        resize(0)


def access_interceptors(
    config: CoordinatorConfig, keys: ApiKeys | None, quotas: QuotaBook | None = None
) -> list[grpc.ServerInterceptor]:
    """API keys (when configured), then per-key quotas (when set): UNAUTHENTICATED before RESOURCE_EXHAUSTED.
    `quotas`: a book shared with the HTTP API (default: a new one when config.quota limits anything)."""
    interceptors: list[grpc.ServerInterceptor] = [] if keys is None else [ApiKeyInterceptor(keys)]
    if quotas is None and config.quota.limited:
        quotas = QuotaBook(config.quota)
    if quotas is not None:
        interceptors.append(QuotaInterceptor(quotas, keys))
    return interceptors


def create_server(
    config: CoordinatorConfig,
    orchestrator: Orchestrator | None = None,
    keys: ApiKeys | None = None,
    quotas: QuotaBook | None = None,
    metrics: CoordinatorMetrics | None = None,
) -> tuple[ManagedServer, int]:
    """Build the coordinator server (port 0 allowed); returns (server, bound port).

    `keys`: the loaded API keys (the caller keeps them to reload on SIGHUP); loaded from
    config.api_keys_file when not given. `metrics`: shared with the HTTP API (its registry is the
    one /metrics serves); a new one when not given.
    """
    check_access(config)
    if keys is None and config.api_keys_file is not None:
        keys = ApiKeys(config.api_keys_file)
    public = [f"/{SERVICE_NAME}/Generate", f"/{SERVICE_NAME}/GenerateStream"]
    metrics = metrics or CoordinatorMetrics(new_registry())
    observe = Observe(metrics.registry, config.metrics_port, admission=public, originates_ids=public)
    orchestrator = orchestrator or build_orchestrator(config)
    orchestrator.on_round = metrics.observe_round
    orchestrator.on_target_failure = lambda kind: metrics.target_failures.labels(kind).inc()
    servicer = CoordinatorServicer(orchestrator, config, metrics)
    server, port, _ = create_grpc_server(
        config.address,
        [lambda s: coordinator_pb2_grpc.add_CoordinatorServicer_to_server(servicer, s)],
        [SERVICE_NAME],
        max_workers=config.max_workers,
        tls=config.tls,
        require_client_cert=False,  # public clients authenticate with API keys, not certificates
        interceptors=access_interceptors(config, keys, quotas),
        health_port=config.health_port,
        observe=observe,
        max_receive_bytes=GRPC_MAX_REQUEST_BYTES,
    )
    return server, port


def check_access(config: CoordinatorConfig) -> None:
    """Anyone who reaches an open coordinator may generate: only on loopback, or when asked explicitly."""
    if config.api_keys_file is None and not config.allow_anonymous and not is_loopback(config.host):
        raise FailedPrecondition(
            f"refusing to serve {config.host} without API keys: give --api-keys-file "
            "(`calispec keys add NAME --file F`), bind 127.0.0.1, or pass --allow-anonymous"
        )

"""gRPC servicer for the target service: protobuf -> TargetEngine -> protobuf."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from calispec.v1 import target_pb2, target_pb2_grpc
from calispec_core.access import PeerAllowlistInterceptor
from calispec_core.errors import InvalidArgument
from calispec_core.forward_costs import TARGET_TOKEN_COUNTS, measure_forward_costs
from calispec_core.generation import Mode, mode_from_wire
from calispec_core.grpc_server import create_grpc_server, handler_threads
from calispec_core.metrics import new_registry
from calispec_core.modeling import ModelRunner, check_prompt_fits
from calispec_core.observability import ManagedServer, Observe
from calispec_core.prefix_cache import PrefixCache
from calispec_core.protocol import (
    model_info_to_pb,
    output_from_pb,
    sampling_from_pb,
    session_stats_to_pb,
    sparse_q_from_pb,
    timing_to_pb,
)
from calispec_core.sparse_q import SparseQ
from calispec_core.timing import Stopwatch
from target_service.config import TargetConfig
from target_service.engine import RescueConfig, TargetEngine, check_draft_count
from target_service.memory_link import MemoryLink
from target_service.metrics import TargetMetrics
from target_service.pair_table import PairTable

SERVICE_NAME = target_pb2.DESCRIPTOR.services_by_name["TargetService"].full_name


def rescue_from_pb(request: target_pb2.TargetPrefillRequest) -> RescueConfig:
    """Mode and τ/λ of a prefill; an absent `rescue` message means the paper's defaults."""
    mode = mode_from_wire(request.mode, default=Mode.CSD)
    if not request.HasField("rescue"):
        return RescueConfig(mode)
    return RescueConfig(mode, request.rescue.tau, request.rescue.lambda_)


def probs_from_pb(data: bytes, rows: int, vocab_size: int) -> torch.Tensor | None:
    """Decode the draft's float32 [rows, vocab_size] distributions; empty bytes = none sent."""
    if not data:
        return None
    if vocab_size == 0 or len(data) != rows * vocab_size * 4:
        raise InvalidArgument(f"draft_probs has {len(data)} bytes, expected {rows} x {vocab_size} float32")
    array = np.frombuffer(data, dtype="<f4").reshape(rows, vocab_size)
    return torch.from_numpy(array.copy())


def draft_q_from_pb(request: target_pb2.VerifyRequest) -> torch.Tensor | SparseQ | None:
    """The draft's q as sent: sparse (validated by the engine) or dense; None when neither is."""
    rows = len(request.draft_token_ids)
    if not request.HasField("draft_sparse_probs"):
        return probs_from_pb(request.draft_probs, rows, request.draft_vocab_size)
    if request.draft_probs:
        raise InvalidArgument("send draft_probs or draft_sparse_probs, not both")
    return sparse_q_from_pb(request.draft_sparse_probs)


class TargetServicer(target_pb2_grpc.TargetServiceServicer):
    def __init__(
        self, engine: TargetEngine, metrics: TargetMetrics | None = None, link: MemoryLink | None = None
    ) -> None:
        self.engine = engine
        self.metrics = metrics or TargetMetrics(new_registry(), engine, link)  # a registry of its own
        self.link = link

    def Prefill(self, request, context):
        watch = Stopwatch()
        check_prompt_fits(len(request.token_ids), self.engine.runner.max_context)
        sampling = sampling_from_pb(request.sampling)
        rescue = rescue_from_pb(request)
        asked = request.prompt_logprobs if request.HasField("prompt_logprobs") else None
        output = output_from_pb(request)
        logprobs = self.engine.prefill(
            request.session_id, list(request.token_ids), sampling, rescue, watch, asked, output
        )
        return target_pb2.TargetPrefillResponse(
            timing=timing_to_pb(watch), prompt_logprobs=[lp.to_pb() for lp in logprobs or ()]
        )

    def Verify(self, request, context):
        watch = Stopwatch()
        check_draft_count(len(request.draft_token_ids))  # before the conversion, as a prompt's length
        draft = list(request.draft_token_ids)
        probs = draft_q_from_pb(request)
        if self.link is not None and draft:
            self.link.note_request()  # the memory write carrying this round's events names the request
        logprobs = request.logprobs if request.HasField("logprobs") else None
        result = self.engine.verify(request.session_id, draft, probs, watch, request.cohort, logprobs)
        self.metrics.verified(len(draft), result)
        return target_pb2.VerifyResponse(
            accepted_count=result.accepted_count,
            rescued_positions=result.rescued_positions,
            next_token_id=result.next_token,
            next_is_bonus=result.next_is_bonus,
            rejections=result.rejections,
            batch_size=result.batch_size,
            batch_tokens=result.batch_tokens,
            withheld_rescues=result.withheld_rescues,
            timing=timing_to_pb(watch),
            logprobs=[lp.to_pb() for lp in result.logprobs or ()],
        )

    def Close(self, request, context):
        self.engine.close(request.session_id)
        return target_pb2.TargetCloseResponse()

    def GetModelInfo(self, request, context):
        info = model_info_to_pb(self.engine.runner)
        info.structured_output = self.engine.constraints is not None
        return target_pb2.TargetModelInfoResponse(info=info)

    def GetStats(self, request, context):
        table = self.engine.table.stats()
        return target_pb2.TargetStatsResponse(
            sessions=session_stats_to_pb(self.engine.sessions.stats()),
            memory_version=table.version,
            memory_pairs=table.snapshot_pairs,
            memory_pairs_skipped=table.skipped_pairs,
        )


@dataclass
class TargetRuntime:
    """The target's background parts: the verify batcher and the memory link (if any)."""

    engine: TargetEngine
    link: MemoryLink | None

    def stop(self) -> None:
        """After server.stop(): finish queued rounds, then ship the last events."""
        self.engine.sessions.stop_reaper()
        self.engine.stop()
        if self.link is not None:
            self.link.stop()


def create_server(config: TargetConfig, runner: ModelRunner | None = None) -> tuple[ManagedServer, int, TargetRuntime]:
    """Build the target server (port 0 allowed); its background parts are started and returned."""
    runner = runner or ModelRunner(config.model)
    if config.measure_forward_costs:
        runner.forward_costs = measure_forward_costs(runner, TARGET_TOKEN_COUNTS)
    table = PairTable(runner.vocab_size, runner.device)
    link = MemoryLink.from_config(config, table) if config.memory_address else None
    engine = TargetEngine(
        runner, config.max_sessions, table, config.max_batch_size, config.session_idle_ttl_s,
        gather_s=config.batch_gather_s, prefix_cache=PrefixCache(config.prefix_cache_tokens),
        meaning_guard=config.meaning_guard, ride_prefill_tokens=config.ride_prefill_tokens,
        structured_output=config.structured_output,
    )  # fmt: skip
    engine.sessions.start_reaper()
    observe = Observe(metrics_port=config.metrics_port, admission=[f"/{SERVICE_NAME}/Prefill"])
    servicer = TargetServicer(engine, TargetMetrics(observe.registry, engine, link), link)
    server, port, health = create_grpc_server(
        config.address,
        [lambda s: target_pb2_grpc.add_TargetServiceServicer_to_server(servicer, s)],
        [SERVICE_NAME],
        max_workers=handler_threads(config.max_workers, config.max_batch_size),
        tls=config.tls,
        interceptors=[PeerAllowlistInterceptor(set(config.allowed_clients))] if config.tls.enabled else [],
        health_port=config.health_port,
        observe=observe,
    )
    server.idle = lambda: len(engine.sessions) == 0  # a drain waits for the coordinator to close them
    if engine.constraints is not None:
        engine.constraints.tokenizer()  # built now, not under the first constrained request (TargetConfig)
    if link is not None:
        link.report_health(health)
        link.start()
    return server, port, TargetRuntime(engine, link)

"""gRPC servicer for the draft service: protobuf -> Proposer -> protobuf."""

from __future__ import annotations

from calispec.v1 import draft_pb2, draft_pb2_grpc
from calispec_core.access import PeerAllowlistInterceptor
from calispec_core.errors import require
from calispec_core.forward_costs import DRAFT_TOKEN_COUNTS, measure_forward_costs
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
    sparse_q_to_pb,
    timing_to_pb,
)
from calispec_core.timing import Stopwatch
from draft_service.config import DraftConfig
from draft_service.metrics import DraftMetrics
from draft_service.proposer import Proposer

SERVICE_NAME = draft_pb2.DESCRIPTOR.services_by_name["DraftService"].full_name


class DraftServicer(draft_pb2_grpc.DraftServiceServicer):
    def __init__(self, proposer: Proposer, metrics: DraftMetrics | None = None) -> None:
        self.proposer = proposer
        self.metrics = metrics or DraftMetrics(new_registry(), proposer)  # a registry of its own

    def Prefill(self, request, context):
        watch = Stopwatch()
        check_prompt_fits(len(request.token_ids), self.proposer.runner.max_context)
        sampling = sampling_from_pb(request.sampling)
        self.proposer.prefill(request.session_id, list(request.token_ids), sampling, watch, output_from_pb(request))
        return draft_pb2.DraftPrefillResponse(timing=timing_to_pb(watch))

    def _appended(self, request) -> list[int]:
        """The tokens to append, refused from their count before conversion (as a prompt's: check_prompt_fits)."""
        count, context = len(request.append_token_ids), self.proposer.runner.max_context
        require(count < context, f"{count} append_token_ids cannot fit the context ({context})")
        return list(request.append_token_ids)

    def Propose(self, request, context):
        watch = Stopwatch()
        rollback_to = request.rollback_to if request.HasField("rollback_to") else None
        proposal = self.proposer.propose(
            request.session_id,
            request.num_tokens,
            rollback_to,
            self._appended(request),
            watch,
            min_confidence=request.min_confidence,
            cohort=request.cohort,
            min_path_confidence=request.min_path_confidence,
        )
        self.metrics.proposed(len(proposal.token_ids))
        response = draft_pb2.ProposeResponse(
            token_ids=proposal.token_ids,
            token_probs=proposal.token_probs,
            vocab_size=self.proposer.runner.vocab_size,
        )
        if proposal.sparse is not None:
            response.sparse_probs.CopyFrom(sparse_q_to_pb(proposal.sparse))
        elif proposal.probs is not None:
            response.probs = proposal.probs.numpy().astype("<f4").tobytes()
        response.timing.CopyFrom(timing_to_pb(watch))  # last: the handler's time includes the encoding
        return response

    def Rollback(self, request, context):
        length = self.proposer.rollback(request.session_id, request.length, self._appended(request))
        return draft_pb2.RollbackResponse(length=length)

    def Close(self, request, context):
        self.proposer.close(request.session_id)
        return draft_pb2.DraftCloseResponse()

    def GetModelInfo(self, request, context):
        return draft_pb2.DraftModelInfoResponse(info=model_info_to_pb(self.proposer.runner))

    def GetStats(self, request, context):
        return draft_pb2.DraftStatsResponse(sessions=session_stats_to_pb(self.proposer.sessions.stats()))


def create_server(config: DraftConfig, runner: ModelRunner | None = None) -> tuple[ManagedServer, int]:
    """Build the draft server on config.address (port 0 allowed); returns (server, bound port)."""
    runner = runner or ModelRunner(config.model, output_vocab=config.draft_vocab)
    if config.measure_forward_costs:
        runner.forward_costs = measure_forward_costs(runner, DRAFT_TOKEN_COUNTS)
    proposer = Proposer(
        runner,
        config.max_sessions,
        config.session_idle_ttl_s,
        config.max_batch_size,
        config.proposal_top_k,
        config.batch_gather_s,
        PrefixCache(config.prefix_cache_tokens),
        config.ride_prefill_tokens,
        config.structured_output,
    )
    proposer.sessions.start_reaper()
    observe = Observe(metrics_port=config.metrics_port, admission=[f"/{SERVICE_NAME}/Prefill"])
    servicer = DraftServicer(proposer, DraftMetrics(observe.registry, proposer))
    server, port, _ = create_grpc_server(
        config.address,
        [lambda s: draft_pb2_grpc.add_DraftServiceServicer_to_server(servicer, s)],
        [SERVICE_NAME],
        max_workers=handler_threads(config.max_workers, config.max_batch_size),
        tls=config.tls,
        interceptors=[PeerAllowlistInterceptor(set(config.allowed_clients))] if config.tls.enabled else [],
        health_port=config.health_port,
        observe=observe,
    )
    server.idle = lambda: len(proposer.sessions) == 0  # a drain waits for the coordinator to close them
    if proposer.constraints is not None:
        proposer.constraints.tokenizer()  # built before it serves, not under the first constrained request
    return server, port

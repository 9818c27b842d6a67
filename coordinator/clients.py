"""gRPC implementations of the coordinator's backends; downstream errors become domain errors."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import grpc

from calispec.v1 import common_pb2, draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc
from calispec_core import errors
from calispec_core.credentials import DRAFT, TARGET, TlsConfig
from calispec_core.generation import FREE_OUTPUT, Mode, SessionOutput, TokenLogprob
from calispec_core.grpc_server import make_channel
from calispec_core.protocol import output_fields, sampling_to_pb
from calispec_core.request_context import with_request_id
from calispec_core.sampling import SamplingConfig
from coordinator.backends import ModelFacts, Opened, Proposal, SessionLost, Verdict

T = TypeVar("T")

# Downstream status -> what the coordinator's caller sees. A model service's INVALID_ARGUMENT on a
# request the coordinator built is still the caller's input (e.g. a prompt too long for the context).
_PASS_THROUGH: dict[grpc.StatusCode, type[errors.CalispecError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    # the service lost the session (restarted, or reaped it as idle): retryable, not the caller's fault
    grpc.StatusCode.NOT_FOUND: SessionLost,
}


@contextmanager
def _mapped(service: str) -> Iterator[None]:
    try:
        yield
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details()
        error = _PASS_THROUGH.get(code)
        if error is None:
            raise errors.CalispecError(f"{service} failed with {code.name}: {details}") from exc
        raise error(f"{service}: {details}") from exc


def _facts(info: common_pb2.ModelInfo) -> ModelFacts:
    return ModelFacts(
        info.model_id,
        info.vocab_size,
        info.tokenizer_fingerprint,
        info.max_context,
        tuple(info.eos_token_ids),
        {c.new_tokens: c.ms for c in info.forward_costs},
        info.structured_output,
        info.logit_rules,
    )


def _call(service: str, fn: Callable[..., T], request: object, timeout: float) -> T:
    with _mapped(service):
        return fn(request, timeout=timeout)


class GrpcDraftBackend:
    def __init__(self, address: str, tls: TlsConfig | None = None) -> None:
        self.address = address
        self.channel = make_channel(address, tls, server_name=DRAFT)
        self.stub = draft_pb2_grpc.DraftServiceStub(with_request_id(self.channel))
        self.logit_rules = False  # until info() says otherwise

    def info(self, timeout: float) -> ModelFacts:
        facts = _facts(_call("draft", self.stub.GetModelInfo, draft_pb2.DraftModelInfoRequest(), timeout).info)
        self.logit_rules = facts.logit_rules
        return facts

    def prefill(
        self,
        session_id: str,
        token_ids: list[int],
        sampling: SamplingConfig,
        timeout: float,
        output: SessionOutput = FREE_OUTPUT,
    ) -> int:
        request = draft_pb2.DraftPrefillRequest(
            session_id=session_id, token_ids=token_ids, sampling=sampling_to_pb(sampling), **output_fields(output)
        )
        return _call("draft", self.stub.Prefill, request, timeout).timing.total_ns

    def propose(
        self,
        session_id: str,
        num_tokens: int,
        rollback_to: int | None,
        append: list[int],
        timeout: float,
        min_confidence: float = 0.0,
        cohort: int = 0,
        min_path_confidence: float = 0.0,
    ) -> Proposal:
        request = draft_pb2.ProposeRequest(
            session_id=session_id,
            num_tokens=num_tokens,
            rollback_to=rollback_to,
            append_token_ids=append,
            min_confidence=min_confidence,
            cohort=cohort,
            min_path_confidence=min_path_confidence,
        )
        response = _call("draft", self.stub.Propose, request, timeout)
        sparse = response.sparse_probs.SerializeToString() if response.HasField("sparse_probs") else b""
        return Proposal(
            list(response.token_ids),
            response.probs,
            response.vocab_size,
            response.timing.total_ns,
            response.timing.forward_ns,
            sparse,
            response.timing.prefill_ns,
        )

    def close(self, session_id: str, timeout: float) -> None:
        _call("draft", self.stub.Close, draft_pb2.DraftCloseRequest(session_id=session_id), timeout)


class GrpcTargetBackend:
    def __init__(self, address: str, tls: TlsConfig | None = None) -> None:
        self.address = address
        self.channel = make_channel(address, tls, server_name=TARGET)
        self.stub = target_pb2_grpc.TargetServiceStub(with_request_id(self.channel))
        self.structured_output = False  # until info() says otherwise: a constraint never goes where it is ignored
        self.logit_rules = False  # likewise for logit rules

    def info(self, timeout: float) -> ModelFacts:
        facts = _facts(_call("target", self.stub.GetModelInfo, target_pb2.TargetModelInfoRequest(), timeout).info)
        self.structured_output = facts.structured_output
        self.logit_rules = facts.logit_rules
        return facts

    def prefill(
        self,
        session_id: str,
        token_ids: list[int],
        sampling: SamplingConfig,
        mode: Mode,
        tau: float,
        lambda_: int,
        timeout: float,
        prompt_logprobs: int | None = None,
        output: SessionOutput = FREE_OUTPUT,
    ) -> Opened:
        request = target_pb2.TargetPrefillRequest(
            session_id=session_id,
            token_ids=token_ids,
            sampling=sampling_to_pb(sampling),
            mode=int(mode),
            rescue=common_pb2.RescueParams(tau=tau, lambda_=lambda_),
            prompt_logprobs=prompt_logprobs,
            **output_fields(output),
        )
        r = _call("target", self.stub.Prefill, request, timeout)
        asked = prompt_logprobs is not None
        return Opened(r.timing.total_ns, [TokenLogprob.from_pb(lp) for lp in r.prompt_logprobs] if asked else None)

    def verify(
        self, session_id: str, proposal: Proposal | None, timeout: float, cohort: int = 0, logprobs: int | None = None
    ) -> Verdict:
        request = target_pb2.VerifyRequest(session_id=session_id, cohort=cohort, logprobs=logprobs)
        if proposal is not None:
            request.draft_token_ids.extend(proposal.token_ids)
            request.draft_probs = proposal.probs
            request.draft_vocab_size = proposal.vocab_size
            if proposal.sparse_probs:
                request.draft_sparse_probs.MergeFromString(proposal.sparse_probs)
        r = _call("target", self.stub.Verify, request, timeout)
        return Verdict(
            r.accepted_count,
            list(r.rescued_positions),
            r.next_token_id,
            r.next_is_bonus,
            r.rejections,
            r.batch_size,
            r.timing.total_ns,
            r.timing.memory_ns,
            r.timing.forward_ns,
            r.batch_tokens,
            r.withheld_rescues,
            [TokenLogprob.from_pb(lp) for lp in r.logprobs] if logprobs is not None else None,
        )

    def close(self, session_id: str, timeout: float) -> None:
        _call("target", self.stub.Close, target_pb2.TargetCloseRequest(session_id=session_id), timeout)

"""The draft and target services' domain engines as in-process coordinator backends.

`coordinator.engine.Orchestrator` drives them exactly as it drives the gRPC services (the
backend protocols of coordinator/backends.py), so offline tools (the probability-ratio
analysis, the calibration exactness check) run the one propose/verify loop of the codebase
with both models in this process: no sockets, no second loop.
"""

from __future__ import annotations

import numpy as np
import torch

from calispec.v1 import common_pb2
from calispec_core.generation import FREE_OUTPUT, Mode, SessionOutput
from calispec_core.modeling import ModelRunner
from calispec_core.protocol import sparse_q_from_pb, sparse_q_to_pb
from calispec_core.sampling import SamplingConfig
from calispec_core.sparse_q import SparseQ
from calispec_core.timing import Stopwatch
from coordinator.backends import ModelFacts, Opened, Proposal, Verdict
from coordinator.engine import Orchestrator
from draft_service.proposer import Proposer
from target_service.engine import RescueConfig, RoundObserver, TargetEngine
from target_service.pair_table import PairTable

MAX_SESSIONS = 64


def _facts(runner: ModelRunner) -> ModelFacts:
    return ModelFacts(
        runner.model_id, runner.vocab_size, runner.fingerprint, runner.max_context, tuple(runner.eos_token_ids)
    )


class InProcessDraft:
    """DraftBackend over a `Proposer`."""

    logit_rules = True

    def __init__(self, runner: ModelRunner) -> None:
        self.proposer = Proposer(runner, MAX_SESSIONS)

    def info(self, timeout: float) -> ModelFacts:
        return _facts(self.proposer.runner)

    def prefill(
        self,
        session_id: str,
        token_ids: list[int],
        sampling: SamplingConfig,
        timeout: float,
        output: SessionOutput = FREE_OUTPUT,
    ) -> int:
        watch = Stopwatch()
        self.proposer.prefill(session_id, token_ids, sampling, watch, output)
        return watch.total_ns

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
        watch = Stopwatch()
        p = self.proposer.propose(
            session_id, num_tokens, rollback_to, append, watch, min_confidence, cohort, min_path_confidence
        )
        probs = b"" if p.probs is None else p.probs.numpy().astype("<f4").tobytes()  # as on the wire
        sparse = b"" if p.sparse is None else sparse_q_to_pb(p.sparse).SerializeToString()
        vocab = self.proposer.runner.vocab_size
        return Proposal(p.token_ids, probs, vocab, watch.total_ns, watch.get("forward"), sparse)

    def close(self, session_id: str, timeout: float) -> None:
        self.proposer.close(session_id)


class InProcessTarget:
    """TargetBackend over a `TargetEngine` with its own `PairTable` (no memory service behind it)."""

    address = "in-process"

    def __init__(
        self,
        runner: ModelRunner,
        table: PairTable | None = None,
        observer: RoundObserver | None = None,
        meaning_guard: bool = True,  # as served; an SD-only analysis skips its keys (~2 s for a real vocabulary)
    ):
        self.table = table or PairTable(runner.vocab_size, runner.device)
        self.engine = TargetEngine(runner, MAX_SESSIONS, self.table, observer=observer, meaning_guard=meaning_guard)
        self.structured_output = self.engine.constraints is not None
        self.logit_rules = True

    def info(self, timeout: float) -> ModelFacts:
        return _facts(self.engine.runner)

    def prefill(
        self,
        session_id,
        token_ids,
        sampling,
        mode: Mode,
        tau,
        lambda_,
        timeout,
        prompt_logprobs=None,
        output: SessionOutput = FREE_OUTPUT,
    ) -> Opened:
        watch = Stopwatch()
        rescue = RescueConfig(mode, tau, lambda_)
        logprobs = self.engine.prefill(session_id, token_ids, sampling, rescue, watch, prompt_logprobs, output)
        return Opened(watch.total_ns, logprobs)

    def verify(
        self, session_id: str, proposal: Proposal | None, timeout: float, cohort: int = 0, logprobs: int | None = None
    ) -> Verdict:
        watch = Stopwatch()
        draft = proposal.token_ids if proposal else []
        probs: torch.Tensor | SparseQ | None = None
        if proposal and proposal.sparse_probs:
            probs = sparse_q_from_pb(common_pb2.SparseDistributions.FromString(proposal.sparse_probs))
        elif proposal and proposal.probs:
            rows = np.frombuffer(proposal.probs, dtype="<f4").reshape(len(draft), proposal.vocab_size)
            probs = torch.from_numpy(rows.copy())
        r = self.engine.verify(session_id, draft, probs, watch, cohort, logprobs)
        return Verdict(
            r.accepted_count, r.rescued_positions, r.next_token, r.next_is_bonus, r.rejections, r.batch_size,
            watch.total_ns, watch.get("memory"), watch.get("forward"), withheld_rescues=r.withheld_rescues,
            logprobs=r.logprobs,
        )  # fmt: skip

    def close(self, session_id: str, timeout: float) -> None:
        self.engine.close(session_id)

    def stop(self) -> None:
        self.engine.stop()


def in_process_orchestrator(
    draft: ModelRunner, target: InProcessTarget, eos_token_ids: tuple[int, ...] | None = None
) -> Orchestrator:
    """An Orchestrator over both models in this process (the target's tokenizer, as the coordinator)."""
    runner = target.engine.runner
    eos = tuple(runner.eos_token_ids) if eos_token_ids is None else eos_token_ids
    return Orchestrator(runner.tokenizer, InProcessDraft(draft), [target], eos, runner.max_context)

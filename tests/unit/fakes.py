"""In-process fakes of the model services: deterministic 'models' over a character vocabulary."""

from __future__ import annotations

from collections.abc import Callable

from calispec_core.errors import NotFound, Unavailable
from calispec_core.generation import FREE_OUTPUT, Mode, SessionOutput, TokenLogprob
from calispec_core.sampling import SamplingConfig
from coordinator.backends import ModelFacts, Opened, Proposal, SessionLost, Verdict

EOS = 0
Model = Callable[[list[int]], int]  # sequence -> greedy next token


class CharTokenizer:
    """One token per ASCII character; id 0 is EOS (dropped by decode)."""

    eos_token_id = EOS

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if i != EOS)

    def __len__(self) -> int:  # ids 0-127 decode
        return 128


def facts() -> ModelFacts:
    return ModelFacts("fake", 128, "fp", 4096, (EOS,))


class _Killable:
    """`kill()` makes every call fail UNAVAILABLE and drops the sessions, like a dead process; `revive()` restarts."""

    down = False
    failed_calls = 0
    sessions: dict[str, list[int]]

    def kill(self) -> None:
        self.down = True
        self.sessions.clear()

    def revive(self) -> None:
        self.down = False

    def _check_up(self) -> None:
        if self.down:
            self.failed_calls += 1
            raise Unavailable("connection refused")

    def _session(self, session_id: str) -> list[int]:
        if session_id not in self.sessions:
            raise SessionLost(f"unknown session {session_id}")  # NOT_FOUND, as the coordinator maps it
        return self.sessions[session_id]


class FakeDraft(_Killable):
    logit_rules = True

    def __init__(self, model: Model) -> None:
        self.model = model
        self.sessions: dict[str, list[int]] = {}
        self.proposals: list[list[int]] = []
        self.prefills: list[list[int]] = []
        self.cohorts: list[int] = []  # each Propose's cohort hint
        self.early_stops: list[tuple[float, float]] = []  # each Propose's (min_confidence, min_path_confidence)
        self.outputs: list[SessionOutput] = []  # each Prefill's session output

    def info(self, timeout: float) -> ModelFacts:
        return facts()

    def prefill(
        self,
        session_id: str,
        token_ids: list[int],
        sampling: SamplingConfig,
        timeout: float,
        output: SessionOutput = FREE_OUTPUT,
    ) -> int:
        self._check_up()
        self.sessions[session_id] = list(token_ids)
        self.prefills.append(list(token_ids))
        self.outputs.append(output)
        return 1_000

    def propose(
        self, session_id, num_tokens, rollback_to, append, timeout, min_confidence=0.0, cohort=0, min_path_confidence=0
    ) -> Proposal:
        self._check_up()
        self.cohorts.append(cohort)
        self.early_stops.append((min_confidence, min_path_confidence))
        seq = self._session(session_id)
        if rollback_to is not None:
            del seq[rollback_to:]
        seq.extend(append)
        proposed = []
        for _ in range(num_tokens):
            proposed.append(self.model(seq + proposed))
        seq.extend(proposed)
        self.proposals.append(proposed)
        return Proposal(proposed, b"", 128, 2_000)

    def close(self, session_id: str, timeout: float) -> None:
        self._check_up()
        if self.sessions.pop(session_id, None) is None:
            raise NotFound(session_id)


class FakeTarget(_Killable):
    """Greedy exact-match verification against `model`, committing like the real target."""

    address = "fake"
    structured_output = True
    logit_rules = True

    def __init__(self, model: Model) -> None:
        self.model = model
        self.sessions: dict[str, list[int]] = {}
        self.rejections = 0
        self.prefills: list[list[int]] = []
        self.cohorts: list[int] = []  # each Verify's cohort hint
        self.prompt_logprobs_asked: list[int | None] = []  # each Prefill's prompt_logprobs
        self.outputs: list[SessionOutput] = []  # each Prefill's session output

    def info(self, timeout: float) -> ModelFacts:
        return facts()

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
        self._check_up()
        self.sessions[session_id] = list(token_ids)
        self.prefills.append(list(token_ids))
        self.prompt_logprobs_asked.append(prompt_logprobs)
        self.outputs.append(output)
        if prompt_logprobs is None:
            return Opened(3_000)
        # token i's "log-probability" is -i, so a test can tell the entries apart and see their order
        return Opened(3_000, [TokenLogprob(-float(i), (), ()) for i in range(1, len(token_ids))])

    def verify(
        self, session_id: str, proposal: Proposal | None, timeout: float, cohort: int = 0, logprobs: int | None = None
    ) -> Verdict:
        self._check_up()
        self.cohorts.append(cohort)
        seq = self._session(session_id)
        draft = proposal.token_ids if proposal else []
        accepted = 0
        for token in draft:
            if self.model(seq) != token:
                break
            seq.append(token)
            accepted += 1
        next_token = self.model(seq)
        seq.append(next_token)
        rejected = int(accepted < len(draft))
        self.rejections += rejected
        return Verdict(accepted, [], next_token, accepted == len(draft), rejected, 1, 4_000, 100)

    def close(self, session_id: str, timeout: float) -> None:
        self._check_up()
        if self.sessions.pop(session_id, None) is None:
            raise NotFound(session_id)

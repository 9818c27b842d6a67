"""The propose/verify loop of one request (no gRPC here).

Per round: the draft proposes γ tokens (after rolling back to what the target kept last
round and appending the token the target emitted), the target verifies them in one
forward pass and commits the outcome to its own session, and the new tokens are handed
out. γ is the request's own when it fixes one; otherwise the cost model chooses it per
round (0 = a plain target step, where drafting would lose) and the draft may stop a
proposal early when unsure. Mode `ar` skips the draft: each round is one plain target step.

Concurrent requests run their rounds in lockstep (`lockstep.py`): they start a round together,
so they draft as one batch, and verify together, so the target verifies them as one batch;
the round start decides every member's γ at once (`round_plan.py`: wave 6's median cap, or the
opt-in shared phase).

Failures of one service end no request by themselves. The draft is optional: while it is
unavailable (a circuit breaker probes it again after a backoff) rounds run target-only and
the stats count them. A target replica that is gone mid-request is replaced by another one,
opened from the prompt plus the tokens already emitted, so the stream neither repeats nor
loses a token; UNAVAILABLE only when no replica is left.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Literal, TypeVar

from transformers import PreTrainedTokenizerBase

from calispec_core.errors import (
    STOPS_SERVING,
    CalispecError,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    Unavailable,
    require,
)
from calispec_core.generation import (
    FinishReason,
    GenerationParams,
    GenerationStats,
    Mode,
    SessionOutput,
    TokenLogprob,
    validate_prompt,
)
from calispec_core.limits import DEFAULT_LOCKSTEP_PHASE, LockstepPhase, require_lockstep_phase
from calispec_core.logit_rules import LogitRules, tokenize_bad_words
from calispec_core.timing import Deadline, Stopwatch, now_ns, ns_to_ms
from coordinator.backends import DraftBackend, Proposal, SessionLost, TargetBackend, Verdict
from coordinator.chat import InvalidParam
from coordinator.circuit import CircuitBreaker
from coordinator.cost_model import CostModel, GammaPolicy
from coordinator.detokenizer import IncrementalDetokenizer
from coordinator.lockstep import Lockstep, Planner
from coordinator.replicas import ReplicaSet
from coordinator.round_plan import Wish, group_phase, median_cap, shared_phase

log = logging.getLogger(__name__)
T = TypeVar("T")
TargetFailure = Literal["session", "placement"]  # what a failing replica held: the request's session, or a new one

CLOSE_TIMEOUT_S = 5.0
DRAFT_TIMEOUT_S = 10.0  # a draft call taking longer counts as a draft outage (the round runs target-only)


@dataclass
class Chunk:
    """New output of one round; the last chunk of a request carries finish_reason and stats."""

    token_ids: list[int]
    text: str
    request_id: str
    finish_reason: FinishReason | None = None
    stats: GenerationStats | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the request asked for them
    # on the first chunk of a request that asked for prompt_logprobs: its prompt and one entry per token from the second
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None


@dataclass(frozen=True)
class SpeculationConfig:
    """Adaptive γ's bounds (requests that fix γ get exactly it, without early stops)."""

    max_gamma: int = 10
    draft_min_confidence: float = 0.4  # HF's assistant_confidence_threshold default
    # The draft stops once its proposal's path probability is below this; None: from the cost model per round
    # (CostModel.path_confidence_floor); 0: off.
    draft_min_path_confidence: float | None = None
    # A request alone in its round that drafts at all drafts up to max_gamma (room allowing) and lets the path
    # floor stop it (round_plan.alone); False: its policy's γ. Needs the path floor on.
    draft_to_floor: bool = True
    # Adaptive γ follows measured times, so a seeded sampling request (whose samples must reproduce)
    # that sets no γ gets this fixed one instead (`adaptive_gamma`).
    seeded_gamma: int = 6
    # Lockstep rounds (`lockstep.py`): how long a request waits for the others to finish their
    # rounds before all start the next one together; 0 turns lockstep off.
    lockstep_wait_s: float = 0.5
    # How a lockstep round's members get their γ (`round_plan.py`): "group", one phase length for the members that
    # draft, planned for the whole group by the cost model, no early stops while several draft (the default since
    # wave 38); "median", wave 6's rule (each its own choice, capped at the drafting members' lower median wish);
    # "shared", every adaptive member drafts that cap's length, without early stops.
    lockstep_phase: LockstepPhase = DEFAULT_LOCKSTEP_PHASE

    def __post_init__(self) -> None:
        require_lockstep_phase(self.lockstep_phase)


def adaptive_gamma(params: GenerationParams) -> bool:
    """Whether a request's γ adapts: it sets none, and it is no seeded sampling request, whose random draws depend
    on how the rounds fall (it gets the fixed `SpeculationConfig.seeded_gamma`). A greedy one draws nothing, its seed
    unused: adaptive like any greedy. A rescuing mode's output hangs on γ too (`output_follows_its_rounds`), but its
    γ adapts all the same: its speed is its point; a client that wants it reproducible fixes γ (README)."""
    return params.num_speculative_tokens is None and not seeded_sampling(params)


def seeded_sampling(params: GenerationParams) -> bool:
    """A sampling request with a seed: its output must be the same however its rounds meet others'."""
    return params.sampling.seed is not None and not params.sampling.greedy


RESCUING_MODES = frozenset({Mode.CSD, Mode.OCM_ONLY, Mode.SCG_ONLY})


def output_follows_its_rounds(params: GenerationParams) -> bool:
    """Whether a request's output depends on how its rounds fall, so that with a fixed γ it never joins another's
    round at γ 0: a seeded sampling request's draws, and a rescuing mode's tokens (only a drafted token can be
    rescued: a position the round did not draft is the target's own; found by probing, a greedy `scg_only` with
    γ 6 wrote another text beside 8 `sd` clients). With an adaptive γ neither is reproducible (README)."""
    return seeded_sampling(params) or params.mode in RESCUING_MODES


@dataclass
class _Request:
    request_id: str
    prompt_ids: list[int]
    params: GenerationParams
    max_new_tokens: int
    deadline: Deadline
    watch: Stopwatch = field(default_factory=Stopwatch)
    stats: GenerationStats = field(default_factory=GenerationStats)
    generated: list[int] = field(default_factory=list)
    target: TargetBackend | None = None  # the replica holding target_session
    target_session: str = ""
    failed_targets: set[str] = field(default_factory=set)  # replicas this request must not use again
    device_failures: int = 0  # its verifies that met a replica's device failing (it moves after the first only)
    draft_session: str | None = None  # None: not open, or lost with the draft
    # what the draft must do before its next proposal to match the committed sequence
    draft_rollback_to: int | None = None
    draft_append: list[int] = field(default_factory=list)
    opened: list[tuple[DraftBackend | TargetBackend, str]] = field(default_factory=list)  # sessions to close
    _sessions_per_service: Counter[str] = field(default_factory=Counter)
    policy: GammaPolicy | None = None  # adaptive γ; None when the request fixes γ
    opening_ns: int = 0  # wall time spent on outages during the current round (failed calls, reopened sessions)
    waiting_ns: int = 0  # wall time spent waiting for the other requests (lockstep) during the current round
    start_wait_ns: int = 0  # the part of it at the round's start (the others' previous rounds still ending)
    gammas: int = 0  # sum of the γ asked for, for stats.mean_gamma
    prompt_logprobs: list[TokenLogprob] | None = None  # from the first target session's prefill, when asked for
    rules: LogitRules | None = None  # params.rules as the model services take them (Orchestrator._session_rules)

    draft_refused: bool = False  # the draft refused this request: it runs target-only from then on

    @property
    def use_draft(self) -> bool:
        return self.params.mode != Mode.AR and not self.draft_refused

    @property
    def committed_ids(self) -> list[int]:
        return [*self.prompt_ids, *self.generated]

    def next_session_id(self, service: str) -> str:
        """The request id for its first session on a service, then `<id>-1`, `<id>-2`... for reopened ones."""
        n = self._sessions_per_service[service]
        self._sessions_per_service[service] += 1
        return self.request_id if n == 0 else f"{self.request_id}-{n}"


@contextmanager
def _opening(request: _Request) -> Iterator[None]:
    """Time spent opening a session (a prefill), kept out of the round's overhead."""
    start = now_ns()
    try:
        yield
    finally:
        request.opening_ns += now_ns() - start


@contextmanager
def _closed_if_abandoned(backend: DraftBackend | TargetBackend, session_id: str) -> Iterator[None]:
    """A prefill we stop waiting for may still open its session on the service afterwards: close it (a Close
    that arrives while it computes drops it when done: sessions.py). On a thread of its own: nobody waits
    for it, and a hung service would otherwise hold the request's end for the Close's timeout."""
    try:
        yield
    except DeadlineExceeded:
        threading.Thread(target=_close_quietly, args=(backend, session_id), name="close-abandoned", daemon=True).start()
        raise


def _check_report(what: str, sent: int, expected: int) -> None:
    """A report a request asked for (log-probabilities) comes one per token, or the request fails before its round
    or its first round counts: a target that predates it sends none (FAILED_PRECONDITION: upgrade it), any other
    count is a target's bug."""
    if sent == 0 and expected > 0:
        raise FailedPrecondition(f"this target replica serves no {what} (it predates them)")
    if sent != expected:
        raise CalispecError(f"the target sent {sent} {what} for {expected} tokens")


def _close_quietly(backend: DraftBackend | TargetBackend, session_id: str) -> None:
    try:
        backend.close(session_id, CLOSE_TIMEOUT_S)
    except SessionLost:  # closed already: the service reaped it as idle (a long target-only stretch) or restarted
        log.debug("session %s was closed already", session_id)
    except Exception as exc:  # best effort: the service's idle TTL ends it otherwise
        log.warning("closing session %s failed: %s", session_id, exc)


class Orchestrator:
    """Runs requests against one draft and N target replicas (a request sticks to one replica)."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        draft: DraftBackend,
        targets: list[TargetBackend] | ReplicaSet,  # a ReplicaSet may change while serving
        eos_token_ids: tuple[int, ...],
        max_context: int,
        draft_circuit: CircuitBreaker | None = None,
        draft_timeout_s: float = DRAFT_TIMEOUT_S,
        costs: CostModel | None = None,  # None: not measured (fallback curves, corrected online)
        speculation: SpeculationConfig = SpeculationConfig(),
        vocab_size: int | None = None,  # the models' (smaller) output width: top_k beyond it is refused here
    ) -> None:
        require(len(targets) > 0, "at least one target replica is required")
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.draft = draft
        self.replicas = targets if isinstance(targets, ReplicaSet) else ReplicaSet(targets)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_context = max_context
        self.draft_circuit = draft_circuit or CircuitBreaker()  # shared by all requests
        self.draft_timeout_s = draft_timeout_s
        self.costs = costs or CostModel.from_measured({}, {})
        self.speculation = speculation
        self.lockstep = Lockstep(speculation.lockstep_wait_s, self._round_planner())  # shared by all requests
        self.on_round: Callable[[Mode, Proposal | None, Verdict], None] | None = None  # e.g. metrics
        # a replica failed a request: "session" (it held the request: a failover) or "placement" (a new session)
        self.on_target_failure: Callable[[TargetFailure], None] | None = None
        self._running: dict[int, _Request] = {}  # id() -> request, from its start to its sessions' close
        self._running_lock = threading.Lock()
        self._stopping = False  # close_running_sessions ran: no session opens, no round starts

    @property
    def context_length(self) -> int:
        """The longest sequence, prompt plus completion, a request may reach: the smallest model context less
        one position, kept spare. max_new_tokens beyond it is cut to what fits (finish reason LENGTH)."""
        return self.max_context - 1

    def generate(
        self,
        prompt: str | Sequence[int],  # text, or token ids of the target's tokenizer (used as they are)
        params: GenerationParams,
        deadline: Deadline,
        cancelled: Callable[[], bool] = lambda: False,
        check_prompt: Callable[[int], None] | None = None,
        on_start: Callable[[str, GenerationStats], None] | None = None,
    ) -> Iterator[Chunk]:
        """Yield one chunk per round until EOS, a stop string or the token limit. `check_prompt` gets the
        prompt's token count before any session opens, and raises to refuse the request (the HTTP API
        refuses what the context cannot hold instead of cutting it short). `on_start` gets the request's id and
        its stats as they grow, once the request is accepted (the request log of one that ends early reads them).
        `cancelled` is asked at every round's start: True ends the request CANCELLED (DEADLINE_EXCEEDED once the
        request's own deadline has passed), and it may raise instead (a call gRPC ended at its client's deadline)."""
        request = self._new_request(prompt, params, deadline, check_prompt)
        if on_start is not None:
            on_start(request.request_id, request.stats)
        with self._running_lock:
            self._running[id(request)] = request
        try:
            self._prefill(request)
            try:
                yield from self._rounds(request, cancelled)
            finally:
                self.lockstep.leave(request.request_id)
        finally:
            with self._running_lock:
                self._running.pop(id(request), None)
            self._close(request)

    def close_running_sessions(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """At the coordinator's stop, the sessions of the requests still running (those its drain timed out on):
        they ended with the process, and each model service's own drain then waited its whole timeout (20 s) for
        sessions nobody would close (found by probing). From now on no request opens a session or starts a round
        (it would reopen what this closed); the closes run at once, all within `timeout_s` (a hung service's
        timeouts one after the other outlasted a pod's grace)."""
        self._stopping = True
        with self._running_lock:
            running = list(self._running.values())
        closes = [
            threading.Thread(target=self._close, args=(request,), name="close-at-stop", daemon=True)
            for request in running
        ]
        for close in closes:
            close.start()
        deadline = time.monotonic() + timeout_s
        for close in closes:
            close.join(max(0.0, deadline - time.monotonic()))

    def _check_not_stopping(self) -> None:
        if self._stopping:
            raise Unavailable("the coordinator is stopping: retry elsewhere")

    def _new_request(
        self,
        prompt: str | Sequence[int],
        params: GenerationParams,
        deadline: Deadline,
        check_prompt: Callable[[int], None] | None,
    ) -> _Request:
        params.validate(self.vocab_size)  # a model service would refuse it as "target: ...", with no field
        prompt_ids = self.prompt_ids(prompt)
        if check_prompt is not None:
            check_prompt(len(prompt_ids))
        room = self.context_length - len(prompt_ids)
        if room < 1:
            raise InvalidArgument(
                f"prompt of {len(prompt_ids)} tokens leaves no room in the context ({self.context_length} tokens)"
            )
        request = _Request(uuid.uuid4().hex, prompt_ids, params, min(params.max_new_tokens, room), deadline)
        request.rules = self._session_rules(params)
        request.stats.prompt_tokens = len(prompt_ids)
        if request.use_draft and adaptive_gamma(params):
            request.policy = GammaPolicy(self.costs, self.speculation.max_gamma)
        return request

    def prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        """The prompt's token ids: a text encoded; ids checked (INVALID_ARGUMENT when empty, or for an id the
        tokenizer cannot decode) and used as they are."""
        if isinstance(prompt, str):
            validate_prompt(prompt)
            ids = self.tokenizer.encode(prompt)
            require(len(ids) > 0, "prompt encodes to no tokens")
            return ids
        ids, size = list(prompt), len(self.tokenizer)
        require(len(ids) > 0, "prompt_token_ids must not be empty")
        if len(ids) > self.context_length:  # refused for its length next: no scan of millions of ids first
            return ids
        bad = next((t for t in ids if not 0 <= t < size), None)
        if bad is not None:  # named as the HTTP API's `prompt`
            raise InvalidParam(f"prompt token id {bad} is not a token of the tokenizer (0 to {size - 1})", "prompt")
        return ids

    def _prefill(self, request: _Request) -> None:
        """Open the target session, and the draft's unless it is down (then the first proposal that
        finds it back opens it): a draft prefill inside a round would hold up the requests in step."""
        self._open_target(request)
        # a round drafts at most the tokens left less the target's own: one token (a log-likelihood request of
        # lm-eval's, echo with max_tokens 1) leaves the draft nothing to do, so it opens no session there
        if request.use_draft and request.max_new_tokens > 1 and self.draft_circuit.allow():
            try:
                self._prefill_draft(request)
            except CalispecError as exc:
                self._draft_unusable(request, exc)
            else:
                self.draft_circuit.succeeded()

    def _open_target(self, request: _Request) -> None:
        """Open a target session from prompt + emitted tokens on a replica that has not failed this request."""
        p = request.params
        while True:
            self._check_not_stopping()
            target = self.replicas.pick(exclude=request.failed_targets | self._unfit(request))  # or UNAVAILABLE
            session_id = request.next_session_id("target")
            ids, timeout = request.committed_ids, request.deadline.remaining()
            # asked of the first session only: a failover reopens the session, not the prompt's report
            asked = p.prompt_logprobs if request.prompt_logprobs is None else None
            try:
                with _closed_if_abandoned(target, session_id):
                    opened = target.prefill(
                        session_id,
                        ids,
                        p.sampling,
                        p.mode,
                        p.tau,
                        p.lambda_,
                        timeout,
                        asked,
                        self._output(request),
                    )
            except Unavailable as exc:
                self._target_failed(request, target, exc, "placement")
                self._check_device_failures(request, exc)  # a Prefill can set a device off too (review)
                continue
            self.replicas.succeeded(target.address)
            request.target, request.target_session = target, session_id
            request.opened.append((target, session_id))
            request.stats.target_ms += ns_to_ms(opened.service_ns)
            if asked is not None:  # one per prompt token from the second
                request.prompt_logprobs = list(opened.prompt_logprobs or ())
                _check_report("prompt log-probabilities", len(request.prompt_logprobs), len(request.prompt_ids) - 1)
            return

    def _unfit(self, request: _Request) -> set[str]:
        """Replicas a request must not use: they would ignore its grammar or logit rules (an older target) or refuse
        its grammar (--no-structured-output). FAILED_PRECONDITION when that is every replica."""
        p, replicas = request.params, self.replicas.backends()
        needs = {
            "serves structured output (each runs an older version or --no-structured-output)": (
                p.constraint is not None,
                {r.address for r in replicas if not r.structured_output},
            ),
            "applies logit rules (penalties, logit_bias, min_p, min_tokens, allowed ids, bad_words; each is older)": (
                p.rules is not None,
                {r.address for r in replicas if not r.logit_rules},
            ),
        }
        unfit: set[str] = set()
        for what, (needed, lacking) in needs.items():
            if needed and replicas and len(lacking) == len(replicas):
                raise FailedPrecondition(f"no target replica {what}")
            unfit |= lacking if needed else set()
        if replicas and len(unfit) == len(replicas):
            raise FailedPrecondition("no target replica serves both structured output and logit rules")
        return unfit

    def _session_rules(self, params: GenerationParams) -> LogitRules | None:
        """The request's logit rules as the model services take them, once a request: with the ids that would end
        its output (min_tokens holds them back), its bad words tokenized."""
        rules = params.rules
        if rules is None:
            return None
        rules = rules.ending([*params.stop_token_ids, *(() if params.ignore_eos else self.eos_token_ids)])
        if rules.bad_words:
            rules = rules.with_bad_word_ids(tokenize_bad_words(self.tokenizer, rules.bad_words))
        return rules

    @staticmethod
    def _output(request: _Request) -> SessionOutput:
        """What a session's output follows (the request's grammar and logit rules), and how much of it is written
        (a reopened session replays it)."""
        return SessionOutput.of(request.params.constraint, request.rules, len(request.generated))

    def _draft_output(self, request: _Request) -> SessionOutput:
        """The session output for the draft: without the rules where the draft is older than them (it would refuse
        their `written` without a grammar; the rules move acceptance only there)."""
        output = self._output(request)
        if output.rules is None or self.draft.logit_rules:
            return output
        return SessionOutput.of(output.constraint, None, output.written)

    def _target_failed(self, request: _Request, target: TargetBackend, exc: Exception, kind: TargetFailure) -> None:
        """`target` failed the request (`kind`: its "session", or a "placement"): never again for this request."""
        log.warning("target %s failed request %s (%s); trying another replica", target.address, request.request_id, exc)
        request.failed_targets.add(target.address)
        self.replicas.failed(target.address)
        if self.on_target_failure is not None:
            self.on_target_failure(kind)

    def _rounds(self, request: _Request, cancelled: Callable[[], bool]) -> Iterator[Chunk]:
        rules = request.params.rules
        detok = IncrementalDetokenizer(self.tokenizer, request.params.stop, rules.min_tokens if rules else 0)
        first = True
        while True:
            if cancelled():
                request.deadline.remaining()  # raises if the call ended at the request's own deadline (a watchdog's)
                raise Cancelled("request cancelled by the client")
            self._check_not_stopping()
            new_tokens, logprobs = self._round(request)
            finish = self._clip(request, new_tokens)
            text, stopped, kept = detok.add(new_tokens)
            if stopped:
                finish = FinishReason.STOP
                del new_tokens[kept:]  # past the stop string: not the output's, whatever the round emitted
            logprobs = logprobs[: len(new_tokens)] if logprobs is not None else None
            request.generated += new_tokens
            request.stats.emitted += len(new_tokens)
            prompt_ids, prompt_logprobs = self._prompt_report(request) if first else (None, None)
            first = False
            if finish is None:
                yield Chunk(
                    new_tokens,
                    text,
                    request.request_id,
                    logprobs=logprobs,
                    prompt_token_ids=prompt_ids,
                    prompt_logprobs=prompt_logprobs,
                )
                continue
            if not stopped:
                text += detok.finish()
            if request.stats.drafted:  # (stats.acceptance_rate is only set by _final_stats, below)
                self.costs.observe_acceptance(request.stats.accepted / request.stats.drafted)
            # out of the group before the last chunk: its consumer may never ask for more (an HTTP stream
            # whose first chunk is its last), and the others would wait for this request at every round start
            self.lockstep.leave(request.request_id)
            stats = self._final_stats(request)
            yield Chunk(new_tokens, text, request.request_id, finish, stats, logprobs, prompt_ids, prompt_logprobs)
            return

    @staticmethod
    def _prompt_report(request: _Request) -> tuple[list[int] | None, list[TokenLogprob] | None]:
        """The first chunk's prompt ids and log-probabilities, when the request asked for them."""
        if request.params.prompt_logprobs is None:
            return None, None
        return list(request.prompt_ids), request.prompt_logprobs

    def _round(self, request: _Request) -> tuple[list[int], list[TokenLogprob] | None]:
        """One propose/verify round; returns the tokens it emits (and their log-probabilities, when asked for)."""
        start, request.opening_ns, request.waiting_ns = now_ns(), 0, 0
        remaining = request.max_new_tokens - len(request.generated)
        gamma = self._drafting_gamma(request, min(self._gamma(request), remaining - 1))
        probing = gamma > 0 and self.draft_circuit.is_open  # allowed while open: this request probes the draft
        wish = self._wish(request, gamma, remaining - 1, probing)
        try:
            start_gate = self._wait_for_others(
                request, lambda member, timeout: self.lockstep.start_round(member, timeout, wish)
            )
        except BaseException:
            if probing:  # it never called: the next request may probe at once
                self.draft_circuit.give_up_probe()
            raise
        request.start_wait_ns = request.waiting_ns
        # the round's choice for it: a fixed γ stays as it is, but a request joining a drafting round verifies with γ 0
        gamma = start_gate.gamma
        if probing and gamma == 0:  # a round plan left the probe out: another request may probe at once
            self.draft_circuit.give_up_probe()
        if gamma > 0 and not probing and self.draft_circuit.is_open:  # the draft failed while it waited
            request.stats.draft_unavailable_rounds += 1
            gamma = 0
        priced = min(gamma, wish.gamma)  # the path floor's price: the policy's γ, not a lone request's reach
        plan = self._plan(request, gamma, priced, start_gate.cohort) if log.isEnabledFor(logging.DEBUG) else None
        # a Propose after target-only rounds first feeds the draft every token it missed: not a per-token cost
        catching_up = len(request.draft_append) > 1 or request.draft_session is None
        # each call's cohort: the members sent with it, so the service batches them whole (lockstep.py)
        proposal, propose_ns = self._propose(request, gamma, start_gate.cohort, priced) if gamma > 0 else (None, 0)
        replica = request.target.address if request.target is not None else None
        cohort = self._wait_for_others(
            request, lambda member, timeout: self.lockstep.before_verify(member, timeout, replica)
        )
        verdict = self._verify(request, proposal, cohort)
        self.lockstep.verified(request.request_id)  # the round's work is done: what a newcomer waits for
        drafted = proposal.token_ids[: verdict.accepted_count] if proposal else []
        new_tokens = [*drafted, verdict.next_token]
        if request.params.logprobs is not None:
            _check_report("log-probabilities", len(verdict.logprobs or ()), len(new_tokens))
        self._account(request, gamma, proposal, verdict)
        # a prefill inside the round (a draft reopened after an outage, a failover) is per request, not
        # per round; waiting for the other requests is the price of batching them, not overhead
        round_ns = now_ns() - start - request.opening_ns - request.waiting_ns
        self._learn(request, proposal, verdict, propose_ns, round_ns, catching_up)
        if plan is not None:
            self._log_round(request, gamma, plan, proposal, verdict, round_ns, propose_ns)
        if self.on_round is not None:
            self.on_round(request.params.mode, proposal, verdict)
        if request.use_draft:
            self._sync_draft_later(request, proposal, verdict)
        return new_tokens, verdict.logprobs

    def _round_planner(self) -> Planner:
        """The lockstep's rule for a round's γ (round_plan.py): the group's phase, wave 6's cap, or the shared phase."""
        rules: dict[LockstepPhase, Planner] = {
            "group": partial(group_phase, self.costs), "median": median_cap, "shared": shared_phase,
        }  # fmt: skip
        return rules[self.speculation.lockstep_phase]

    def _wish(self, request: _Request, gamma: int, room: int, probing: bool) -> Wish:
        """What this request brings to the round start: a fixed γ as it is; an adaptive one with how far it may
        draft (`room`: tokens left after the target's own; no further than its wish while the draft circuit is
        open, where only a probe calls the draft, or while it has no draft session), the least (a probe drafts its
        wish: a plan that left the draft circuit's probe out would keep the draft off until the probe expired), and,
        under the group phase, its first draft's acceptance."""
        policy = request.policy
        if policy is None or not request.use_draft:
            # a round of γ 0 is the same whenever it runs: only a drafting one waits for its round start (review)
            return Wish.fixed(gamma, reproducible=gamma > 0 and output_follows_its_rounds(request.params))
        # a raised member without a draft session would prefill it inside the group's round (`_prefill`)
        hold = probing or self.draft_circuit.is_open or request.draft_session is None
        limit = gamma if hold else max(min(self.speculation.max_gamma, room), 0)
        floor = gamma if policy.probing or probing else 0  # a probe of the policy's or of the draft circuit drafts
        reach = self.costs.path_reach(gamma, limit) if self._drafts_to_floor() and not policy.probing else 0
        # (a lone round's reach: lockstep on; with it off, or out of step, a request drafts its own γ)
        alpha = policy.tracker.alphas(1)[0] if self.speculation.lockstep_phase == "group" else None  # what it prices
        return Wish(gamma, True, limit, floor, reach, alpha)

    def _drafts_to_floor(self) -> bool:
        """Whether a lone adaptive request drafts past its γ: only where a path floor can stop its proposal."""
        speculation = self.speculation
        return speculation.draft_to_floor and speculation.draft_min_path_confidence != 0

    def _drafting_gamma(self, request: _Request, gamma: int) -> int:
        """γ, or 0 where the draft circuit skips the draft: asked before the round's start gate, so a skipped
        request is no drafter of its round and the Propose cohort counts only the calls really sent."""
        if gamma > 0 and not self.draft_circuit.allow():
            request.stats.draft_unavailable_rounds += 1
            return 0
        return gamma

    def _gamma(self, request: _Request) -> int:
        if not request.use_draft:
            return 0
        if request.policy is not None:
            return request.policy.next_gamma()
        return request.params.num_speculative_tokens or self.speculation.seeded_gamma

    def _propose(self, request: _Request, gamma: int, cohort: int, priced: int) -> tuple[Proposal | None, int]:
        """γ draft tokens (fewer after an early stop; `priced`: the γ its path floor is priced at) and the Propose
        call's wall time (ns); None when the call fails: the round then runs target-only."""
        start, opening_ns = now_ns(), request.opening_ns
        try:
            proposal, call_ns = self._draft_tokens(request, gamma, cohort, priced)
        except CalispecError as exc:
            request.opening_ns = opening_ns + now_ns() - start  # an outage's wait, not a per-round cost
            self._draft_unusable(request, exc)
            request.stats.draft_unavailable_rounds += 1
            return None, 0
        self.draft_circuit.succeeded()
        return proposal, call_ns

    def _draft_failed(self, request: _Request, exc: Exception) -> None:
        request.deadline.remaining()  # raises if it was the request's own deadline that ran out
        log.warning("draft unavailable for request %s (%s); running target-only", request.request_id, exc)
        self.draft_circuit.failed()
        request.draft_session = None  # reopened from the committed sequence once the draft is back

    def _draft_unusable(self, request: _Request, exc: CalispecError) -> None:
        """A draft call failed: an outage (down, or too slow) or a refusal of this request alone."""
        if isinstance(exc, (Unavailable, DeadlineExceeded)):
            self._draft_failed(request, exc)
        else:
            self._draft_refused(request, exc)

    def _draft_refused(self, request: _Request, exc: CalispecError) -> None:
        """The draft is up but refused this request (its sessions full, a sequence past its context, a bug
        of its own): the draft is optional, so the request goes on target-only; the others keep drafting."""
        request.deadline.remaining()  # raises if it was the request's own deadline that ran out
        log.warning("draft refused request %s (%s); it runs target-only", request.request_id, exc)
        self.draft_circuit.succeeded()  # it answered: not an outage (and a half-open probe has reported)
        request.draft_refused = True

    def _draft_tokens(self, request: _Request, gamma: int, cohort: int, priced: int) -> tuple[Proposal, int]:
        if request.draft_session is None:
            self._open_draft(request)
        start = now_ns()
        try:
            proposal = self._draft_propose(request, gamma, cohort, priced)
        except SessionLost:  # the draft restarted or reaped the session while we ran target-only: it is up
            self._open_draft(request)
            start = now_ns()
            proposal = self._draft_propose(request, gamma, 1, priced)  # out of step with the others now
        request.draft_rollback_to, request.draft_append = None, []
        return proposal, now_ns() - start

    def _learn(
        self,
        request: _Request,
        proposal: Proposal | None,
        verdict: Verdict,
        propose_ns: int,
        round_ns: int,
        catching_up: bool = False,
    ) -> None:
        """Feed the round's measured costs and acceptance to the cost model (and the overhead to the stats)."""
        drafted = len(proposal.token_ids) if proposal else 0
        # overhead: everything but the two models' forwards, as the services measured them (RPCs,
        # conversions, sampling and verification, hand-offs, bookkeeping)
        forwards_ns = verdict.forward_ns + (proposal.forward_ns if proposal else 0)
        request.stats.round_overhead_ms += ns_to_ms(max(round_ns - forwards_ns, 0))
        self.costs.observe_target(drafted + 1, ns_to_ms(verdict.service_ns), verdict.batch_size, verdict.batch_tokens)
        # a catch-up forward would inflate the per-token cost, as would a step that computed a riding prompt (this
        # session's or another's in the same batch: the draft reports such a step's time as prefill_ns)
        if proposal is not None and not catching_up and not proposal.prefill_ns:
            self.costs.observe_draft(
                drafted, ns_to_ms(proposal.forward_ns), ns_to_ms(proposal.service_ns), ns_to_ms(propose_ns)
            )
            self.costs.observe_overhead(ns_to_ms(round_ns - propose_ns - verdict.service_ns))
        elif proposal is None:
            self.costs.observe_overhead(ns_to_ms(round_ns - verdict.service_ns))
        if request.policy is not None:
            request.policy.observe(drafted, verdict.accepted_count)

    def _plan(self, request: _Request, gamma: int, priced: int, cohort: int) -> tuple[float, float, float, int]:
        """For the DEBUG line: the round's predicted ms if it drafts all γ asked (a lone request's reach, where its
        path floor usually stops it sooner), the request's acceptance estimate (nan for a fixed γ), the path floor
        sent and the γ that priced it."""
        alpha = request.policy.tracker.alpha if request.policy is not None else float("nan")
        path_floor = self._path_floor(request, priced, cohort)
        return self.costs.round_ms(gamma, self.costs.batch), alpha, path_floor, priced

    @staticmethod
    def _log_round(
        request: _Request,
        gamma: int,
        plan: tuple[float, float, float, int],
        proposal: Proposal | None,
        verdict: Verdict,
        round_ns: int,
        propose_ns: int,
    ) -> None:
        """One DEBUG line per round: what the policy chose and expected, what the round did and cost."""
        predicted_ms, alpha, path_floor, priced = plan
        log.debug(
            "request %s round: gamma %d drafted %d accepted %d alpha %.2f floor %.2f@%d batch %d | predicted %.1f ms, "
            "measured %.1f ms (target forward %.1f, draft forwards %.1f; Verify %.1f in the target, Propose %.1f "
            "in the draft, %.1f at the caller), waited %.1f ms (%.1f at the start)",
            request.request_id, gamma, len(proposal.token_ids) if proposal else 0, verdict.accepted_count, alpha,
            path_floor, priced, verdict.batch_size, predicted_ms, ns_to_ms(round_ns), ns_to_ms(verdict.forward_ns),
            ns_to_ms(proposal.forward_ns) if proposal else 0.0, ns_to_ms(verdict.service_ns),
            ns_to_ms(proposal.service_ns) if proposal else 0.0, ns_to_ms(propose_ns), ns_to_ms(request.waiting_ns),
            ns_to_ms(request.start_wait_ns),
        )  # fmt: skip

    def _draft_propose(self, request: _Request, gamma: int, cohort: int, priced: int) -> Proposal:
        timeout = min(request.deadline.remaining(), self.draft_timeout_s)
        return self.draft.propose(
            request.draft_session,
            gamma,
            request.draft_rollback_to,
            request.draft_append,
            timeout,
            min_confidence=self._early_stop(request, cohort),
            cohort=cohort,
            min_path_confidence=self._path_floor(request, priced, cohort),
        )

    def _stops_early(self, request: _Request, cohort: int) -> bool:
        """Whether this proposal may stop early: adaptive γ only, and not in a shared phase (several members
        drafting together), which runs as long as its longest proposal whoever stops early: there an early stop
        saves a row's verified tokens, not draft steps (wave 29: `sd` 1.12× `ar` at concurrency 8 without it,
        1.03× with it)."""
        one_phase = self.speculation.lockstep_phase != "median"  # every member drafts its length
        return request.policy is not None and not (cohort > 1 and one_phase)

    def _early_stop(self, request: _Request, cohort: int) -> float:
        """The draft's confidence threshold for this proposal's tokens, where it may stop early."""
        return self.speculation.draft_min_confidence if self._stops_early(request, cohort) else 0.0

    def _path_floor(self, request: _Request, gamma: int, cohort: int) -> float:
        """The draft's path-probability threshold for this proposal, where it may stop early: the configured one,
        or the cost model's for this round's γ and the request's acceptance. A probe (γ chosen for PROBE_ALPHA) is
        priced by the request's own acceptance too, so it often stops after a token: exempting probes ran more
        target-only rounds in the one run that tried it (docs/performance.md, "Where a proposal stops")."""
        policy = request.policy
        if policy is None or not self._stops_early(request, cohort):
            return 0.0
        if self.speculation.draft_min_path_confidence is not None:
            return self.speculation.draft_min_path_confidence
        return self.costs.path_confidence_floor(gamma, policy.tracker.alphas(gamma))

    def _open_draft(self, request: _Request) -> None:
        with _opening(request):
            self._prefill_draft(request)

    def _prefill_draft(self, request: _Request) -> None:
        self._check_not_stopping()
        session_id = request.next_session_id("draft")
        timeout = min(request.deadline.remaining(), self.draft_timeout_s)
        with _closed_if_abandoned(self.draft, session_id):
            ns = self.draft.prefill(
                session_id, request.committed_ids, request.params.sampling, timeout, self._draft_output(request)
            )
        request.draft_session = session_id
        request.opened.append((self.draft, session_id))
        request.draft_rollback_to, request.draft_append = None, []
        request.stats.draft_ms += ns_to_ms(ns)

    @staticmethod
    def _wait_for_others(request: _Request, gate: Callable[[str, float], T]) -> T:
        start = now_ns()
        try:
            return gate(request.request_id, request.deadline.remaining())
        finally:
            request.waiting_ns += now_ns() - start

    def _verify(self, request: _Request, proposal: Proposal | None, cohort: int) -> Verdict:
        """The target's verdict; a replica that is gone is replaced and the same proposal verified there."""
        lost_on: set[str] = set()  # replicas that lost the session once and were given it again
        while True:
            assert request.target is not None
            start = now_ns()
            try:
                return request.target.verify(
                    request.target_session,
                    proposal,
                    request.deadline.remaining(),
                    cohort=cohort,
                    logprobs=request.params.logprobs,
                )
            except Unavailable as exc:
                address = request.target.address
                # a replica that answers it lost the session (restarted, or reaped it as idle) is up: reopen
                # the session there without marking the replica failed, once
                if isinstance(exc, SessionLost) and address not in lost_on:
                    lost_on.add(address)
                elif isinstance(exc, SessionLost) and not self._another_replica(request):
                    # lost again right after its reopening (a session TTL shorter than a round, a restart loop), and
                    # no replica to move to: it said that none was serving, the live one marked failed
                    raise Unavailable(
                        f"target {address} closed this request's session again right after reopening it ({exc}): "
                        "is its session TTL shorter than a round?"
                    ) from exc
                elif isinstance(exc, SessionLost):  # lost again: move it, the replica (up) kept for the others
                    request.failed_targets.add(address)
                    request.stats.target_failovers += 1
                else:
                    self._target_failed(request, request.target, exc, "session")
                    self._check_device_failures(request, exc)
                    # a failover: the replica holding the request failed it (a failed placement is none)
                    request.stats.target_failovers += 1
                self._open_target(request)
                request.opening_ns += now_ns() - start  # the failed call and the new session: an outage's wait
                cohort = 1  # alone, out of step with the others

    @staticmethod
    def _check_device_failures(request: _Request, exc: Unavailable) -> None:
        """A second replica's device failing under the same request (its Prefill or a Verify) ends it: a request
        that breaks devices (a device-side assert its input sets off) would take every replica out in turn, each
        restarted, where one hardware fault moves it once (review). INTERNAL, a bug to look into (CalispecError's
        own code: an HTTP stream ends with an error event, not cut). Its batch mates on both replicas end too."""
        if STOPS_SERVING not in str(exc):
            return
        request.device_failures += 1
        if request.device_failures > 1:
            raise CalispecError(f"a second target replica's device failed under this request ({exc}): not moved again")

    def _another_replica(self, request: _Request) -> bool:
        """Whether a replica other than the request's, and not failed for it, is there to move it to."""
        current = request.target.address if request.target is not None else None
        return any(a != current and a not in request.failed_targets for a in self.replicas.addresses())

    @staticmethod
    def _sync_draft_later(request: _Request, proposal: Proposal | None, verdict: Verdict) -> None:
        """The draft learns the round's outcome with its next Propose, saving a round trip."""
        if request.draft_session is None:
            return  # nothing to sync: the next draft session starts from the committed sequence
        committed = len(request.prompt_ids) + len(request.generated)  # before this round's tokens
        if proposal is not None:
            request.draft_rollback_to = committed + verdict.accepted_count
            request.draft_append = [verdict.next_token]
        else:
            if request.draft_rollback_to is None:
                request.draft_rollback_to = committed
            request.draft_append.append(verdict.next_token)

    @staticmethod
    def _account(request: _Request, gamma: int, proposal: Proposal | None, verdict: Verdict) -> None:
        stats = request.stats
        stats.rounds += 1
        request.gammas += gamma
        stats.target_only_rounds += int(proposal is None)
        stats.target_ms += ns_to_ms(verdict.service_ns - verdict.memory_ns)
        stats.memory_ms += ns_to_ms(verdict.memory_ns)
        stats.rejections += verdict.rejections
        stats.withheld_rescues += verdict.withheld_rescues
        stats.max_batch_size = max(stats.max_batch_size, verdict.batch_size)
        if proposal is not None:
            stats.drafted += len(proposal.token_ids)
            stats.accepted += verdict.accepted_count
            stats.rescued += len(verdict.rescued_positions)
            stats.draft_ms += ns_to_ms(proposal.service_ns)

    def _clip(self, request: _Request, new_tokens: list[int]) -> FinishReason | None:
        """Cut new_tokens (in place) after a stop token id (kept, as vLLM's), at EOS (unless the request ignores
        it) or at the token limit; returns the finish reason, if any."""
        stops, eos = request.params.stop_token_ids, () if request.params.ignore_eos else self.eos_token_ids
        for i, token in enumerate(new_tokens):
            if token in stops or token in eos:
                del new_tokens[i + 1 :]
                return FinishReason.STOP if token in stops else FinishReason.EOS
        room = request.max_new_tokens - len(request.generated)
        if len(new_tokens) >= room:
            del new_tokens[room:]
            return FinishReason.LENGTH
        return None

    @staticmethod
    def _final_stats(request: _Request) -> GenerationStats:
        stats = request.stats
        stats.total_ms = ns_to_ms(request.watch.total_ns)
        stats.coordinator_ms = max(0.0, stats.total_ms - stats.draft_ms - stats.target_ms - stats.memory_ms)
        stats.acceptance_rate = stats.accepted / stats.drafted if stats.drafted else 0.0
        stats.mean_gamma = request.gammas / stats.rounds if stats.rounds else 0.0
        return stats

    def _close(self, request: _Request) -> None:
        """Best effort: a session left behind only costs memory until the service restarts."""
        for backend, session_id in request.opened:
            if backend is not self.draft and backend.address in request.failed_targets:
                continue  # a replica that failed this request: the close would wait out its timeout too
            _close_quietly(backend, session_id)  # closing must not mask the request's outcome

"""The coordinator's round loop against in-process fakes: draft sync, clipping, stats, cleanup."""

from __future__ import annotations

from dataclasses import replace

import pytest

from calispec_core.errors import Cancelled, DeadlineExceeded, FailedPrecondition, InvalidArgument, Unavailable
from calispec_core.generation import Defaults, FinishReason, GenerationParams, Mode
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Deadline
from coordinator import engine as engine_module
from coordinator.backends import SessionLost
from coordinator.engine import Orchestrator, adaptive_gamma
from coordinator.server import stats_to_pb
from tests.unit.fakes import EOS, CharTokenizer, FakeDraft, FakeTarget


def alphabet_target(seq: list[int]) -> int:
    """'a'..'z' cycling after the last character; EOS after 'z' when the prompt starts with '!'."""
    last = seq[-1]
    if seq[0] == ord("!") and last == ord("z"):
        return EOS
    return ord("a") + (last - ord("a") + 1) % 26 if ord("a") <= last <= ord("z") else ord("a")


def sloppy_draft(seq: list[int]) -> int:
    """Agrees with the target except after a vowel."""
    guess = alphabet_target(seq)
    return ord("#") if chr(seq[-1]) in "aeiou" else guess


def params(**overrides) -> GenerationParams:
    d = Defaults()
    base = {
        "max_new_tokens": 20,
        "sampling": SamplingConfig(),
        "stop": (),
        "num_speculative_tokens": 6,  # fixed: the fakes report no meaningful costs for adaptive γ
        "mode": Mode.SD,
        "tau": d.tau,
        "lambda_": d.lambda_,
    }
    return GenerationParams(**(base | overrides))


def make(draft_model=sloppy_draft) -> tuple[Orchestrator, FakeDraft, FakeTarget]:
    draft, target = FakeDraft(draft_model), FakeTarget(alphabet_target)
    return Orchestrator(CharTokenizer(), draft, [target], (EOS,), max_context=4096), draft, target


def run(orchestrator: Orchestrator, prompt: str, p: GenerationParams, **kw):
    return list(orchestrator.generate(prompt, p, Deadline(60), **kw))


@pytest.mark.parametrize("gamma", [1, 2, 5, 16])
def test_speculative_output_equals_the_targets_greedy_output(gamma: int) -> None:
    orchestrator, draft, target = make()
    chunks = run(orchestrator, "c", params(num_speculative_tokens=gamma))
    text = "".join(c.text for c in chunks)
    assert text == "defghijklmnopqrstuvw"
    stats = chunks[-1].stats
    assert chunks[-1].finish_reason == FinishReason.LENGTH and stats is not None
    assert stats.emitted == 20 and stats.rounds == len(chunks)
    assert 0 < stats.accepted < stats.drafted  # the sloppy draft is wrong after each vowel
    assert stats.rejections == target.rejections > 0
    assert stats.drafted == sum(len(p) for p in draft.proposals)
    assert draft.sessions == {} and target.sessions == {}  # both sessions closed


def test_draft_is_rolled_back_to_the_committed_sequence_before_each_proposal() -> None:
    orchestrator, draft, _ = make()
    committed: list[str] = []
    original = draft.propose

    def checking_propose(session_id, num_tokens, rollback_to, append, timeout, **kw):
        proposal = original(session_id, num_tokens, rollback_to, append, timeout, **kw)
        seq = draft.sessions[session_id][: -len(proposal.token_ids)]
        assert "".join(map(chr, seq)) == "a" + "".join(committed)
        return proposal

    draft.propose = checking_propose
    for chunk in orchestrator.generate("a", params(max_new_tokens=30, num_speculative_tokens=3), Deadline(60)):
        committed.extend(map(chr, chunk.token_ids))
    assert "".join(committed) == "bcdefghijklmnopqrstuvwxyzabcde"


def test_eos_ends_the_request_and_is_kept_in_the_token_ids() -> None:
    orchestrator, _, _ = make(draft_model=alphabet_target)
    chunks = run(orchestrator, "!w", params(max_new_tokens=50))
    ids = [t for c in chunks for t in c.token_ids]
    assert ids[-1] == EOS and "".join(c.text for c in chunks) == "xyz"
    assert chunks[-1].finish_reason == FinishReason.EOS
    assert chunks[-1].stats.acceptance_rate == 1.0


def test_max_new_tokens_one_never_drafts() -> None:
    orchestrator, draft, _ = make()
    chunks = run(orchestrator, "a", params(max_new_tokens=1))
    assert [c.text for c in chunks] == ["b"] and draft.proposals == []


def test_ar_mode_uses_no_draft_session() -> None:
    orchestrator, draft, _ = make()
    chunks = run(orchestrator, "a", params(mode=Mode.AR, max_new_tokens=5))
    assert "".join(c.text for c in chunks) == "bcdef" and draft.proposals == []
    assert chunks[-1].stats.rounds == 5 and chunks[-1].stats.drafted == 0


def test_stop_string_cuts_text_and_finishes() -> None:
    orchestrator, _, _ = make()
    chunks = run(orchestrator, "a", params(stop=("fg",), max_new_tokens=20))
    assert "".join(c.text for c in chunks) == "bcde" and chunks[-1].finish_reason == FinishReason.STOP


def test_expired_deadline_raises_and_closes_sessions() -> None:
    orchestrator, draft, target = make()
    deadline = Deadline(0.0)
    with pytest.raises(DeadlineExceeded):
        list(orchestrator.generate("a", params(), deadline))
    assert draft.sessions == {} and target.sessions == {}


def test_cancellation_closes_sessions() -> None:
    orchestrator, draft, target = make()
    with pytest.raises(Cancelled):
        run(orchestrator, "a", params(max_new_tokens=100, num_speculative_tokens=1), cancelled=lambda: True)
    assert draft.sessions == {} and target.sessions == {}


def test_a_consumer_that_stops_early_still_closes_sessions() -> None:
    orchestrator, draft, target = make()
    stream = orchestrator.generate("a", params(max_new_tokens=100, num_speculative_tokens=1), Deadline(60))
    next(stream)
    stream.close()
    assert draft.sessions == {} and target.sessions == {}


def test_the_coordinators_stop_closes_the_sessions_of_requests_still_running() -> None:
    """A request the drain timed out on ended with the coordinator's process, its sessions open: each model
    service's own drain then waited its whole timeout for them (found by probing: `calispec down` 52 s, not 27)."""
    orchestrator, draft, target = make()
    stream = orchestrator.generate("a", params(max_new_tokens=100, num_speculative_tokens=1), Deadline(60))
    next(stream)  # mid-request, as the process stops
    assert draft.sessions and target.sessions
    orchestrator.close_running_sessions()
    assert draft.sessions == {} and target.sessions == {}
    with pytest.raises(Unavailable, match="stopping"):  # no next round: it would reopen what the stop closed
        next(stream)
    assert draft.sessions == {} and target.sessions == {} and orchestrator._running == {}
    with pytest.raises(Unavailable, match="stopping"):  # nor a new request
        run(orchestrator, "b", params())
    assert draft.sessions == {} and target.sessions == {}


def test_prompt_that_fills_the_context_is_invalid() -> None:
    draft, target = FakeDraft(sloppy_draft), FakeTarget(alphabet_target)
    orchestrator = Orchestrator(CharTokenizer(), draft, [target], (EOS,), max_context=8)
    with pytest.raises(InvalidArgument, match="no room"):
        run(orchestrator, "abcdefgh", params())
    assert target.sessions == {}


def test_check_prompt_sees_the_token_count_and_refuses_before_any_session_opens() -> None:
    draft, target = FakeDraft(sloppy_draft), FakeTarget(alphabet_target)
    orchestrator = Orchestrator(CharTokenizer(), draft, [target], (EOS,), max_context=8)
    seen: list[int] = []

    def refuse(prompt_tokens: int) -> None:
        seen.append(prompt_tokens)
        raise InvalidArgument("too long")

    with pytest.raises(InvalidArgument, match="too long"):
        run(orchestrator, "abc", params(), check_prompt=refuse)
    assert seen == [3] and target.sessions == {} and draft.sessions == {}


def test_a_request_that_fits_the_context_length_gets_every_token_it_asked_for() -> None:
    """context_length is the room rule the HTTP API refuses by: prompt + max_new_tokens up to it is never cut."""
    orchestrator = Orchestrator(CharTokenizer(), FakeDraft(sloppy_draft), [FakeTarget(alphabet_target)], (EOS,), 8)
    assert orchestrator.context_length == 7
    fits = run(orchestrator, "abc", params(max_new_tokens=4))
    assert len([t for c in fits for t in c.token_ids]) == 4 and fits[-1].finish_reason == FinishReason.LENGTH
    cut = run(orchestrator, "abc", params(max_new_tokens=5))  # beyond it: cut to what fits (the gRPC API's rule)
    assert len([t for c in cut for t in c.token_ids]) == 4


def test_seeded_request_without_gamma_gets_a_fixed_gamma_so_its_samples_reproduce() -> None:
    orchestrator, draft, _ = make(draft_model=alphabet_target)
    seeded = SamplingConfig(temperature=0.5, seed=3)
    run(orchestrator, "c", params(max_new_tokens=30, num_speculative_tokens=None, sampling=seeded))
    assert {len(p) for p in draft.proposals[:-1]} == {6}  # SpeculationConfig.seeded_gamma; the last is clipped


@pytest.mark.parametrize(
    ("sampling", "gamma", "adaptive"),
    [
        (SamplingConfig(temperature=0.0, seed=3), None, True),  # greedy draws nothing: its seed is unused
        (SamplingConfig(temperature=1e-6, seed=3), None, True),  # below MIN_TEMPERATURE: greedy
        (SamplingConfig(temperature=0.5, seed=3), None, False),  # its samples must reproduce
        (SamplingConfig(temperature=0.5), None, True),
        (SamplingConfig(), None, True),
        (SamplingConfig(temperature=0.0, seed=3), 4, False),  # the request fixes γ
        (SamplingConfig(temperature=0.5), 4, False),
    ],
)
def test_gamma_adapts_unless_fixed_by_the_request_or_its_seeded_samples(
    sampling: SamplingConfig, gamma: int | None, adaptive: bool
) -> None:
    """A seeded greedy request got the seeded sampling's fixed γ = 6: a greedy output does not hang on γ."""
    assert adaptive_gamma(params(sampling=sampling, num_speculative_tokens=gamma)) is adaptive


def test_a_seeded_greedy_request_runs_with_adaptive_gamma(caplog: pytest.LogCaptureFixture) -> None:
    orchestrator, _, _ = make()
    greedy = SamplingConfig(temperature=0.0, seed=3)
    with caplog.at_level("DEBUG", logger=engine_module.log.name):
        run(orchestrator, "c", params(max_new_tokens=4, num_speculative_tokens=None, sampling=greedy))
    first = next(r.getMessage() for r in caplog.records if " round: gamma " in r.getMessage())
    assert "alpha 0.60" in first  # the policy's estimate (a fixed γ logs alpha nan)


def test_the_round_line_splits_the_services_handlers_from_their_forwards(caplog: pytest.LogCaptureFixture) -> None:
    orchestrator, draft, target = make()
    propose, verify = draft.propose, target.verify
    draft.propose = lambda *a, **kw: replace(propose(*a, **kw), service_ns=3 * 10**6, forward_ns=2 * 10**6)
    target.verify = lambda *a, **kw: replace(verify(*a, **kw), service_ns=9 * 10**6, forward_ns=7 * 10**6)
    with caplog.at_level("DEBUG", logger=engine_module.log.name):
        run(orchestrator, "c", params(max_new_tokens=4, num_speculative_tokens=2))
    first = next(r.getMessage() for r in caplog.records if " round: gamma 2 " in r.getMessage())
    assert "(target forward 7.0, draft forwards 2.0; Verify 9.0 in the target, Propose 3.0 in the draft," in first
    assert "at the start)" in first


@pytest.mark.parametrize("forward_ns", [0, 10**10])
def test_round_overhead_is_the_round_minus_the_models_forwards(forward_ns: int) -> None:
    """The services report 10 s handlers: only their forward part may leave the overhead."""
    orchestrator, draft, target = make()
    propose, verify = draft.propose, target.verify
    draft.propose = lambda *a, **kw: replace(propose(*a, **kw), service_ns=10**10, forward_ns=forward_ns)
    target.verify = lambda *a, **kw: replace(verify(*a, **kw), service_ns=10**10, forward_ns=forward_ns)
    stats = run(orchestrator, "c", params(max_new_tokens=5))[-1].stats
    assert stats is not None and stats.rounds >= 1
    if forward_ns:
        assert stats.round_overhead_ms == 0.0  # the forwards "took" longer than the round: clamped
    else:
        assert stats.round_overhead_ms > 0.0  # none of the handlers' time was forward


def test_a_prefill_inside_a_round_is_not_round_overhead(monkeypatch: pytest.MonkeyPatch) -> None:
    """The draft session opens with the first proposal, inside a round: a per-request cost."""
    clock = [0]
    monkeypatch.setattr(engine_module, "now_ns", lambda: clock[0])  # time moves only in the draft's prefill
    orchestrator, draft, _ = make()
    prefill = draft.prefill

    def slow_prefill(*args, **kwargs) -> int:
        clock[0] += 10**10
        return prefill(*args, **kwargs)

    draft.prefill = slow_prefill
    stats = run(orchestrator, "c", params(max_new_tokens=5))[-1].stats
    assert stats is not None and len(draft.prefills) == 1
    assert stats.round_overhead_ms == 0.0


def test_debug_log_traces_every_round_with_its_predicted_and_measured_cost(caplog: pytest.LogCaptureFixture) -> None:
    orchestrator, _, _ = make()
    with caplog.at_level("DEBUG", logger=engine_module.log.name):
        stats = run(orchestrator, "c", params(max_new_tokens=12, num_speculative_tokens=3))[-1].stats
    lines = [r.getMessage() for r in caplog.records if " round: gamma " in r.getMessage()]
    assert stats is not None and len(lines) == stats.rounds
    first = lines[0]
    assert "gamma 3 drafted 3 accepted 2" in first  # d e, then '#' after the vowel: the target says f
    assert "predicted " in first and "measured " in first and "alpha nan" in first  # fixed γ: no policy
    caplog.clear()
    adaptive, _, _ = make()
    with caplog.at_level("DEBUG", logger=engine_module.log.name):
        run(adaptive, "c", params(max_new_tokens=4, num_speculative_tokens=None))
    first = next(r.getMessage() for r in caplog.records if " round: gamma " in r.getMessage())
    assert "alpha 0.60" in first  # adaptive: the request's estimate before any round, the pair's prior


def test_rescues_the_meaning_guard_withheld_reach_the_stats() -> None:
    class WithholdingTarget(FakeTarget):  # as if every rejection had been a guarded rescue
        def verify(self, session_id, proposal, timeout, cohort=0, logprobs=None):
            verdict = super().verify(session_id, proposal, timeout, cohort, logprobs)
            return replace(verdict, withheld_rescues=verdict.rejections)

    draft, target = FakeDraft(sloppy_draft), WithholdingTarget(alphabet_target)
    orchestrator = Orchestrator(CharTokenizer(), draft, [target], (EOS,), max_context=4096)
    stats = run(orchestrator, "c", params(mode=Mode.CSD))[-1].stats
    assert stats is not None and stats.withheld_rescues == target.rejections > 0
    assert stats_to_pb(stats).withheld_rescues == stats.withheld_rescues  # on the wire to clients


def test_the_coordinators_metrics_count_withheld_rescues() -> None:
    from prometheus_client import CollectorRegistry

    from coordinator.backends import Proposal, Verdict
    from coordinator.metrics import CoordinatorMetrics

    registry = CollectorRegistry()
    metrics = CoordinatorMetrics(registry)
    proposal = Proposal([1, 2], b"", 0, 0)
    metrics.observe_round(Mode.CSD, proposal, Verdict(0, [], 5, False, 1, 1, 0, 0, withheld_rescues=1))
    assert registry.get_sample_value("calispec_spec_decode_num_withheld_rescues_total") == 1


def test_log_probabilities_from_a_target_that_predates_them_are_a_clear_failed_precondition() -> None:
    """The fake target, like one of an older release, ignores VerifyRequest.logprobs: the request fails at its first
    round saying why, not as an INTERNAL bug, and before the round is counted."""
    orchestrator, _, _ = make()
    with pytest.raises(FailedPrecondition, match="serves no log-probabilities"):
        run(orchestrator, "c", params(logprobs=2))
    assert [c.text for c in run(orchestrator, "c", params(max_new_tokens=3))]  # those that do not ask still run


def test_a_prompt_of_token_ids_is_used_as_it_is_and_checked() -> None:
    orchestrator, _, target = make()
    by_ids = run(orchestrator, [ord("c")], params())  # type: ignore[arg-type]
    assert "".join(c.text for c in by_ids) == "".join(c.text for c in run(orchestrator, "c", params()))
    assert target.prefills[0] == [ord("c")]
    assert all(c.prompt_token_ids is None for c in by_ids)  # not asked: no prompt report
    for bad, message in (([], "must not be empty"), ([ord("c"), 128], "token id 128 is not a token")):
        with pytest.raises(InvalidArgument, match=message):
            run(orchestrator, bad, params())  # type: ignore[arg-type]
    assert len(target.prefills) == 2  # refused before any session opened
    with pytest.raises(InvalidArgument, match="leaves no room in the context"):  # for its length, ids unscanned
        run(orchestrator, [10**9] * orchestrator.context_length * 2, params())  # type: ignore[arg-type]
    # the usable context, as max_model_len says: it named the models' (one more), which 1023 < 1024 read as room
    full = orchestrator.context_length
    with pytest.raises(
        InvalidArgument, match=f"prompt of {full} tokens leaves no room in the context \\({full} tokens\\)"
    ):
        run(orchestrator, [ord("c")] * full, params())


def test_a_target_without_prompt_logprobs_fails_the_request_before_its_first_round() -> None:
    orchestrator, draft, target = make()
    serve = target.prefill
    target.prefill = lambda *args, **kwargs: serve(*args[:7])  # type: ignore[method-assign]  # drops the ask
    with pytest.raises(FailedPrecondition, match="prompt log-probabilities"):
        run(orchestrator, "cd", params(prompt_logprobs=0))
    assert draft.proposals == [] and target.sessions == {}  # closed again
    assert run(orchestrator, "c", params(prompt_logprobs=0))[0].prompt_logprobs == []  # one token: none to send


def test_a_request_of_one_token_opens_no_draft_session() -> None:
    """Its one round is the target's own token (a round drafts at most the tokens left less one): a draft
    prefill of its prompt was wasted work (every log-likelihood request of lm-eval asks for one token)."""
    orchestrator, draft, target = make()
    (chunk,) = run(orchestrator, "cde", params(max_new_tokens=1))
    assert chunk.text == "f" and chunk.stats is not None and chunk.stats.drafted == 0
    assert draft.prefills == [] and draft.proposals == [] and len(target.prefills) == 1
    run(orchestrator, "cde", params(max_new_tokens=2))
    assert len(draft.prefills) == 1  # two tokens: the first round may draft one


@pytest.mark.parametrize("mode", [Mode.AR, Mode.SD])
def test_a_stop_token_id_ends_the_request_kept_in_its_output(mode: Mode) -> None:
    """vLLM's `stop_token_ids`: the first new token among them ends the request with finish STOP, the token kept
    (a round that drafted past it is cut there), with or without ignore_eos."""
    orchestrator, _, _ = make()
    for ignore_eos in (False, True):
        p = params(mode=mode, stop_token_ids=(ord("g"), ord("x")), ignore_eos=ignore_eos)
        chunks = run(orchestrator, "c", p)
        assert "".join(c.text for c in chunks) == "defg"
        assert chunks[-1].finish_reason == FinishReason.STOP and chunks[-1].stats.emitted == 4
    with pytest.raises(InvalidArgument, match="at most 16 stop token ids"):
        run(orchestrator, "c", params(stop_token_ids=tuple(range(17))))


class _ClosingBackend:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def close(self, session_id: str, timeout: float) -> None:
        raise self.error


def test_closing_a_session_the_service_already_reaped_is_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A draft session reaped as idle during a long target-only stretch logged a WARNING at the request's end, for a
    request that went right; a close that really failed still warns."""
    with caplog.at_level("DEBUG", logger=engine_module.log.name):
        engine_module._close_quietly(_ClosingBackend(SessionLost("no such session")), "s-1")  # type: ignore[arg-type]
        assert [r.levelname for r in caplog.records] == ["DEBUG"]
        engine_module._close_quietly(_ClosingBackend(Unavailable("down")), "s-2")  # type: ignore[arg-type]
    assert [r.levelname for r in caplog.records] == ["DEBUG", "WARNING"]

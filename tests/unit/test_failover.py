"""The round loop when a service dies: target-only rounds without the draft, another replica for a lost target."""

from __future__ import annotations

import pytest

from calispec_core.errors import STOPS_SERVING, CalispecError, DeadlineExceeded, FailedPrecondition, Unavailable
from calispec_core.generation import Mode, OutputConstraint
from calispec_core.logit_rules import LogitRules
from calispec_core.timing import Deadline
from coordinator.circuit import CircuitBreaker
from coordinator.engine import Orchestrator
from tests.helpers import wait_until
from tests.unit.fakes import EOS, CharTokenizer, FakeDraft, FakeTarget
from tests.unit.test_circuit import Clock
from tests.unit.test_orchestrator import alphabet_target, params, sloppy_draft

EXPECTED = "defghijklmnopqrstuvw"  # the target's greedy continuation of "c" (20 tokens)


def target(address: str) -> FakeTarget:
    backend = FakeTarget(alphabet_target)
    backend.address = address  # type: ignore[misc]
    return backend


def make(targets: list[FakeTarget], clock: Clock | None = None) -> tuple[Orchestrator, FakeDraft]:
    draft = FakeDraft(sloppy_draft)
    circuit = CircuitBreaker(backoff_s=1.0, clock=clock or Clock())
    return Orchestrator(CharTokenizer(), draft, targets, (EOS,), 4096, circuit), draft


def test_a_dead_draft_degrades_to_target_only_and_is_probed_once_per_backoff() -> None:
    clock = Clock()
    orchestrator, draft = make([target("t:1")], clock)
    draft.kill()
    for _ in range(3):
        chunks = list(orchestrator.generate("c", params(num_speculative_tokens=4), Deadline(60)))
        assert "".join(c.text for c in chunks) == EXPECTED
        stats = chunks[-1].stats
        assert stats.drafted == 0 and stats.rounds == 20 and stats.degraded
        assert stats.draft_unavailable_rounds == 19  # the last round drafts nothing anyway (one token left)
    assert draft.failed_calls == 1  # one failed call, then skipped until the backoff passes
    clock.now = 1.0
    list(orchestrator.generate("c", params(), Deadline(60)))
    assert draft.failed_calls == 2  # the probe


def test_speculation_resumes_mid_request_when_the_draft_is_back() -> None:
    clock = Clock()
    orchestrator, draft = make([target("t:1")], clock)
    stream = orchestrator.generate("c", params(num_speculative_tokens=2), Deadline(60))
    text = next(stream).text
    draft.kill()
    text += next(stream).text + next(stream).text
    draft.revive()
    clock.now = 1.0
    chunks = list(stream)
    text += "".join(c.text for c in chunks)
    assert text == EXPECTED
    stats = chunks[-1].stats
    assert stats.draft_unavailable_rounds == 2 and stats.drafted > 0
    committed = "c" + EXPECTED[: len(draft.prefills[1]) - 1]
    assert "".join(map(chr, draft.prefills[1])) == committed  # reopened from prompt + emitted tokens
    assert draft.sessions == {}


def test_a_draft_session_reaped_while_running_target_only_is_reopened_without_opening_the_circuit() -> None:
    orchestrator, draft = make([target("t:1")])
    stream = orchestrator.generate("c", params(num_speculative_tokens=2), Deadline(60))
    text = next(stream).text
    draft.sessions.clear()  # the draft reaped the idle session (or restarted between two calls)
    chunks = list(stream)
    assert text + "".join(c.text for c in chunks) == EXPECTED
    assert chunks[-1].stats.draft_unavailable_rounds == 0 and not orchestrator.draft_circuit.is_open
    assert len(draft.prefills) == 2 and draft.sessions == {}


def test_a_lost_target_replica_is_replaced_without_repeating_or_losing_tokens() -> None:
    a, b = target("a:1"), target("b:1")
    orchestrator, draft = make([a, b])
    stream = orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60))
    first = next(stream)
    a.kill()
    chunks = [first, *stream]
    assert "".join(c.text for c in chunks) == EXPECTED
    assert [t for c in chunks for t in c.token_ids] == [ord(ch) for ch in EXPECTED]
    assert chunks[-1].stats.target_failovers == 1 and chunks[-1].stats.drafted > 0
    assert b.prefills == [[ord("c"), *first.token_ids]]  # prompt + what was already emitted
    assert b.sessions == {} and draft.sessions == {}
    # the Verify that failed, and no Close after it: closing there waits out the close timeout too (a
    # replica that drops packets: 5 s a session)
    assert a.failed_calls == 1


@pytest.mark.parametrize("mode", [Mode.AR, Mode.SD])
def test_a_request_routed_to_a_dead_replica_runs_on_another(mode: Mode) -> None:
    a, b = target("a:1"), target("b:1")
    orchestrator, _ = make([a, b])
    a.kill()
    for _ in range(2):  # round-robin sends one of them to the dead replica first
        chunks = list(orchestrator.generate("c", params(mode=mode), Deadline(60)))
        assert "".join(c.text for c in chunks) == EXPECTED
    assert b.sessions == {}


def test_a_failed_first_placement_is_no_failover() -> None:
    """The request was never on the dead replica: it used to count as a move (stats.target_failovers 1)."""
    a, b = target("a:1"), target("b:1")
    orchestrator, _ = make([a, b])
    a.kill()
    chunks = list(orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60)))
    assert "".join(c.text for c in chunks) == EXPECTED
    assert a.failed_calls == 1 and len(b.prefills) == 1  # routed to a first, placed on b
    assert chunks[-1].stats.target_failovers == 0 and not chunks[-1].stats.degraded


def test_a_move_is_one_failover_however_many_replicas_fail_the_new_placement() -> None:
    """Each failed prefill while moving used to count as one more failover."""
    a, b, c = target("a:1"), target("b:1"), target("c:1")
    orchestrator, _ = make([a, b, c])
    stream = orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60))
    first = next(stream)
    a.kill()
    c.kill()
    chunks = [first, *stream]
    assert "".join(ch.text for ch in chunks) == EXPECTED
    assert c.failed_calls == 1 and len(b.prefills) == 1  # the move tried c, then landed on b
    assert chunks[-1].stats.target_failovers == 1


def test_unavailable_only_when_no_replica_is_left() -> None:
    a, b = target("a:1"), target("b:1")
    orchestrator, draft = make([a, b])
    stream = orchestrator.generate("c", params(), Deadline(60))
    next(stream)
    a.kill()
    b.kill()
    with pytest.raises(Unavailable, match="no target replica"):
        list(stream)
    assert draft.sessions == {}


class ManualDeadline(Deadline):
    def __init__(self) -> None:
        super().__init__(60)
        self.expired = False

    def remaining(self) -> float:
        if self.expired:
            raise DeadlineExceeded("deadline exceeded")
        return super().remaining()


def test_the_requests_own_deadline_is_not_a_draft_outage() -> None:
    orchestrator, draft = make([target("t:1")])
    deadline = ManualDeadline()

    def propose_until_the_deadline(*args, **kwargs):
        deadline.expired = True
        raise DeadlineExceeded("draft: Deadline Exceeded")

    draft.propose = propose_until_the_deadline  # type: ignore[method-assign]
    with pytest.raises(DeadlineExceeded):
        list(orchestrator.generate("c", params(), deadline))
    assert not orchestrator.draft_circuit.is_open


def test_a_failed_draft_call_is_not_round_overhead(monkeypatch) -> None:
    """A draft timing out after 10 s used to enter the shared overhead estimate (its EMA moved by ~2 s,
    biasing every request's γ) and the request's round_overhead_ms."""
    import coordinator.engine as engine_module

    clock = [0]
    monkeypatch.setattr(engine_module, "now_ns", lambda: clock[0])  # time moves only in the failing call
    orchestrator, draft = make([target("a:1")])
    propose = draft.propose

    def timing_out(*args, **kwargs):
        if len(draft.proposals) == 1:  # the second round's call hangs, then times out
            clock[0] += 10**10
            raise DeadlineExceeded("draft timed out")
        return propose(*args, **kwargs)

    draft.propose = timing_out
    before = orchestrator.costs.overhead_ms
    chunks = list(orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60)))
    assert "".join(c.text for c in chunks) == EXPECTED
    assert chunks[-1].stats.draft_unavailable_rounds >= 1
    assert chunks[-1].stats.round_overhead_ms == 0.0
    assert orchestrator.costs.overhead_ms <= before


def test_a_draft_that_refuses_a_request_leaves_it_target_only_and_the_others_drafting() -> None:
    """The draft is optional: its session registry full (RESOURCE_EXHAUSTED), a sequence past its context
    (INVALID_ARGUMENT) or a bug of its own (INTERNAL) used to fail the whole request."""
    from calispec_core.errors import CalispecError, ResourceExhausted

    orchestrator, draft = make([target("a:1")])
    prefill = draft.prefill
    refusals = [ResourceExhausted("draft sessions full")]

    def refusing_prefill(*args, **kwargs) -> int:
        if refusals:
            raise refusals.pop()
        return prefill(*args, **kwargs)

    draft.prefill = refusing_prefill
    chunks = list(orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60)))
    assert "".join(c.text for c in chunks) == EXPECTED
    assert chunks[-1].stats.drafted == 0 and draft.prefills == []
    assert not orchestrator.draft_circuit.is_open  # it answered: the next request drafts
    after = list(orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60)))
    assert "".join(c.text for c in after) == EXPECTED and after[-1].stats.drafted > 0
    propose = draft.propose
    draft.propose = lambda *a, **kw: (_ for _ in ()).throw(CalispecError("draft failed with INTERNAL"))
    mid = list(orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60)))
    assert "".join(c.text for c in mid) == EXPECTED and mid[-1].stats.drafted == 0
    draft.propose = propose


def test_a_target_session_lost_on_a_live_replica_is_reopened_there_without_failing_it() -> None:
    """A replica that answers NOT_FOUND for the session (reaped as idle, or a quick restart) is up: it
    used to be marked failed for every request, and with one replica the request failed UNAVAILABLE."""
    only = target("a:1")
    orchestrator, _ = make([only])
    stream = orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60))
    first = next(stream)
    only.sessions.clear()
    chunks = [first, *stream]
    assert "".join(c.text for c in chunks) == EXPECTED
    assert chunks[-1].stats.target_failovers == 0
    assert only.prefills[-1] == [ord("c"), *first.token_ids]  # reopened from what was emitted
    again = list(orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60)))
    assert "".join(c.text for c in again) == EXPECTED


def test_a_prefill_given_up_on_is_closed_with_the_request() -> None:
    """A draft prefill slower than its timeout still opens the session on the service once it ends: nobody
    closed it, and it held a slot and its KV cache until the draft's idle TTL."""
    orchestrator, draft = make([target("a:1")])
    prefill = draft.prefill

    def opened_after_the_timeout(session_id, *args, **kwargs) -> int:
        prefill(session_id, *args, **kwargs)  # the service goes on and opens it
        raise DeadlineExceeded("draft: Deadline Exceeded")

    draft.prefill = opened_after_the_timeout
    chunks = list(orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60)))
    assert "".join(c.text for c in chunks) == EXPECTED and chunks[-1].stats.drafted == 0
    assert len(draft.prefills) == 1
    wait_until(lambda: draft.sessions == {})  # the Close goes out on a thread of its own


def test_a_probe_whose_request_ends_at_the_round_start_lets_the_next_request_probe() -> None:
    """The draft circuit is asked before the lockstep start gate: a request granted the probe that then ended
    at the gate (its deadline) left the probe in flight, and every request skipped the draft for 60 s."""
    clock = Clock()
    orchestrator, draft = make([target("a:1")], clock)
    draft.kill()  # the request's draft prefill fails: the circuit opens for 1 s
    gamma = orchestrator._gamma

    def backoff_passed(request):
        clock.now = 5.0
        return gamma(request)

    def deadline_at_the_gate(member, timeout_s, wish):
        raise DeadlineExceeded("deadline exceeded")

    orchestrator._gamma = backoff_passed  # type: ignore[method-assign]
    orchestrator.lockstep.start_round = deadline_at_the_gate  # type: ignore[method-assign]
    with pytest.raises(DeadlineExceeded):
        list(orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60)))
    assert orchestrator.draft_circuit.is_open and orchestrator.draft_circuit.allow()  # the next one probes


def test_a_request_allowed_to_draft_before_the_draft_failed_does_not_call_it() -> None:
    """The circuit is asked before the round's start gate; the draft failing while a request waits there
    (another request's call) must not send this one's Propose into the dead draft."""
    orchestrator, draft = make([target("a:1")])  # its clock stands still: the circuit stays open
    start_round = orchestrator.lockstep.start_round
    calls = []

    def draft_fails_meanwhile(member, timeout_s, wish):
        if not calls:
            orchestrator.draft_circuit.failed()
        calls.append(wish.gamma)
        return start_round(member, timeout_s, wish)

    orchestrator.lockstep.start_round = draft_fails_meanwhile  # type: ignore[method-assign]
    chunks = list(orchestrator.generate("c", params(num_speculative_tokens=3, max_new_tokens=6), Deadline(60)))
    assert "".join(c.text for c in chunks) == EXPECTED[:6]
    assert calls[0] == 3 and draft.proposals == []  # allowed at first, skipped once the draft had failed
    assert chunks[-1].stats.draft_unavailable_rounds == 5


def test_prompt_logprobs_come_from_the_first_session_and_a_failover_does_not_ask_again() -> None:
    """A request that asks gets its prompt's log-probabilities on its first chunk only; the replica that takes
    it over reopens prompt + emitted tokens without them (they are the prompt's, reported already)."""
    a, b = target("a:1"), target("b:1")
    orchestrator, _ = make([a, b])
    stream = orchestrator.generate("cde", params(num_speculative_tokens=3, prompt_logprobs=2), Deadline(60))
    first = next(stream)
    a.kill()
    rest = list(stream)
    assert first.prompt_token_ids == [ord(ch) for ch in "cde"]
    assert [lp.logprob for lp in first.prompt_logprobs or []] == [-1.0, -2.0]  # the fake's: token i's is -i
    assert all(c.prompt_token_ids is None and c.prompt_logprobs is None for c in rest)
    assert (a.prompt_logprobs_asked, b.prompt_logprobs_asked) == ([2], [None])
    assert rest[-1].stats.target_failovers == 1


def test_a_session_lost_again_right_after_its_reopening_fails_the_request_not_the_replica() -> None:
    """A target reaping sessions faster than a round (a 0.4 s TTL under load, found by probing): the second loss was
    counted as the replica's failure, backed it off, and with one replica said "no target replica is serving"."""
    only = target("a:1")
    verify = only.verify

    def reaping(session_id: str, *args: object, **kwargs: object) -> object:
        only.sessions.pop(session_id, None)  # reaped just before every verify
        return verify(session_id, *args, **kwargs)

    only.verify = reaping  # type: ignore[method-assign]
    orchestrator, _ = make([only])
    failures: list[str] = []
    orchestrator.on_target_failure = failures.append
    with pytest.raises(Unavailable, match="closed this request's session again right after reopening"):
        list(orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60)))
    assert failures == []  # the replica answered every call
    only.verify = verify  # type: ignore[method-assign]
    again = list(orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60)))
    assert "".join(c.text for c in again) == EXPECTED and again[-1].stats.target_failovers == 0


def reaping_target(address: str) -> FakeTarget:
    """A replica that reaps every session just before its verify (a session TTL shorter than a round)."""
    replica = target(address)
    verify = replica.verify

    def reaped(session_id: str, *args: object, **kwargs: object) -> object:
        replica.sessions.pop(session_id, None)
        return verify(session_id, *args, **kwargs)

    replica.verify = reaped  # type: ignore[method-assign]
    return replica


def test_a_session_lost_again_moves_the_request_where_another_replica_serves() -> None:
    """With a replica to move to, a second loss on one is still that replica's failure (found by review: the request
    failed UNAVAILABLE although a healthy replica was there)."""
    orchestrator, _ = make([reaping_target("a:1"), target("b:1")])
    for _ in range(3):  # placed on either replica first
        chunks = list(orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60)))
        assert "".join(c.text for c in chunks) == EXPECTED


def test_replicas_that_all_lose_the_session_again_end_the_request() -> None:
    """Each lost it once, was given it again and lost it again: the request ends (it must not pass the session
    between them until its deadline)."""
    orchestrator, _ = make([reaping_target("a:1"), reaping_target("b:1")])
    with pytest.raises(Unavailable, match="closed this request's session again right after reopening"):
        list(orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60)))


class FailingDevice(FakeTarget):
    """A replica whose device fails under the next Verify (a sticky CUDA error: calispec_core/grpc_server.py)."""

    breaks = False
    breaks_at_prefill = False

    def _fail(self) -> None:
        self.failed_calls += 1
        raise Unavailable(f"target: {STOPS_SERVING} (CUDA error: device-side assert triggered)")

    def verify(self, *args, **kwargs):
        if self.breaks:
            self._fail()
        return super().verify(*args, **kwargs)

    def prefill(self, *args, **kwargs):
        if self.breaks_at_prefill:
            self._fail()
        return super().prefill(*args, **kwargs)


def failing_devices(*addresses: str) -> list[FailingDevice]:
    replicas = [FailingDevice(alphabet_target) for _ in addresses]
    for replica, address in zip(replicas, addresses, strict=True):
        replica.address = address  # type: ignore[misc]
    return replicas


def test_a_request_moves_once_when_its_replicas_device_fails() -> None:
    a, b = failing_devices("a:1", "b:1")
    orchestrator, _ = make([a, b])
    stream = orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60))
    first = next(stream)
    (a if a.sessions else b).breaks = True
    chunks = [first, *stream]
    assert "".join(c.text for c in chunks) == EXPECTED and chunks[-1].stats.target_failovers == 1


def test_a_request_under_which_a_second_device_fails_is_not_moved_again() -> None:
    """Moved on and on, a request whose input sets off a device-side assert took every replica out in turn (each
    then NOT_SERVING until restarted; found by review): the second such failure ends it."""
    replicas = failing_devices("a:1", "b:1", "c:1")
    orchestrator, _ = make(replicas)
    stream = orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60))
    next(stream)
    for replica in replicas:
        replica.breaks = True
    with pytest.raises(CalispecError, match="a second target replica's device failed under this request") as ended:
        list(stream)
    assert ended.value.code == "INTERNAL"  # a bug to look into, not a retry
    assert sorted(r.failed_calls for r in replicas) == [0, 1, 1]  # the third never saw it


def test_a_device_failing_at_the_moved_requests_prefill_counts_too() -> None:
    """The placement after a move was not counted (review): a request whose Prefill sets devices off went on."""
    replicas = failing_devices("a:1", "b:1", "c:1")
    orchestrator, _ = make(replicas)
    stream = orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60))
    next(stream)
    for replica in replicas:
        replica.breaks = replica.breaks_at_prefill = True
    with pytest.raises(CalispecError, match="a second target replica's device failed under this request"):
        list(stream)
    assert sorted(r.failed_calls for r in replicas) == [0, 1, 1]


def test_a_reopened_target_session_replays_a_structured_outputs_written_tokens() -> None:
    """The grammar of a session reopened mid-request starts past what the request wrote (output_written)."""
    only = target("a:1")
    orchestrator, _ = make([only])
    constraint = OutputConstraint.of(regex="[a-z]+")
    stream = orchestrator.generate("c", params(num_speculative_tokens=3, constraint=constraint), Deadline(60))
    first = next(stream)
    only.sessions.clear()
    assert "".join(c.text for c in [first, *stream]) == EXPECTED
    assert [(o.constraint, o.written) for o in only.outputs] == [(constraint, 0), (constraint, len(first.token_ids))]


def test_a_free_requests_reopened_sessions_say_nothing_of_the_written_output() -> None:
    """Only a grammar or logit rules need it, and a model service of wave 59 refuses it without a constraint: a
    rolling upgrade's new coordinator failed every failover onto an old target."""
    only = target("a:1")
    orchestrator, draft = make([only])
    stream = orchestrator.generate("c", params(num_speculative_tokens=3), Deadline(60))
    next(stream)
    only.sessions.clear()
    assert len(list(stream)) > 0 and len(only.outputs) == 2
    assert all(o.written == 0 for o in [*only.outputs, *draft.outputs])


def test_a_structured_output_request_goes_only_where_its_grammar_is_applied() -> None:
    """A target of wave 58 or older ignores the constraint (free text with a 200), one run with --no-structured-output
    refuses it: such replicas are passed over, and with no other the request is refused (found by review)."""
    old, new = target("old:1"), target("new:1")
    old.structured_output = False  # type: ignore[misc]
    orchestrator, _ = make([old, new])
    constrained = params(constraint=OutputConstraint.of(regex="[a-z]+"))
    for _ in range(3):
        assert "".join(c.text for c in orchestrator.generate("c", constrained, Deadline(60))) == EXPECTED
    assert orchestrator.replicas.picks == {"new:1": 3}
    list(orchestrator.generate("c", params(), Deadline(60)))
    list(orchestrator.generate("c", params(), Deadline(60)))
    assert orchestrator.replicas.picks["old:1"] == 1  # free text goes anywhere
    alone, _ = make([old])
    with pytest.raises(FailedPrecondition, match="no target replica serves structured output"):
        list(alone.generate("c", constrained, Deadline(60)))


def test_logit_rules_go_only_to_targets_that_apply_them_with_what_ends_the_output() -> None:
    """A target older than logit rules ignores them (a 200 with other text): it is passed over, and alone it refuses
    the request. The rules each session gets carry what min_tokens holds back: EOS (unless ignored) and the stop
    token ids, which only the coordinator knows."""
    old, new = target("old:1"), target("new:1")
    old.logit_rules = False  # type: ignore[misc]
    orchestrator, draft = make([old, new])
    rules = LogitRules.of(min_tokens=2, presence_penalty=0.5)
    for ignore_eos, ends in ((False, (5, EOS)), (True, (5,))):
        ruled = params(rules=rules, stop_token_ids=(5,), ignore_eos=ignore_eos, max_new_tokens=4)
        list(orchestrator.generate("c", ruled, Deadline(60)))
        assert new.outputs[-1].rules == draft.outputs[-1].rules == rules.ending(ends)
    assert orchestrator.replicas.picks == {"new:1": 2}
    alone, _ = make([old])
    with pytest.raises(FailedPrecondition, match="no target replica applies logit rules"):
        list(alone.generate("c", params(rules=rules), Deadline(60)))


def test_a_draft_older_than_logit_rules_gets_a_request_without_them_and_keeps_drafting() -> None:
    """A wave-59 draft refuses `output_written` without a grammar: a reopened draft session of a request with rules
    was refused, and the request ran target-only from then on (found by review)."""
    only = target("t:1")
    orchestrator, draft = make([only])
    draft.logit_rules = False  # type: ignore[misc]
    rules = LogitRules.of(presence_penalty=0.5)
    stream = orchestrator.generate("c", params(num_speculative_tokens=2, rules=rules), Deadline(60))
    next(stream)
    draft.sessions.clear()  # reopened mid-request
    chunks = list(stream)
    assert chunks[-1].stats.drafted > 0 and len(draft.outputs) == 2
    assert all(o.rules is None and o.written == 0 for o in draft.outputs)
    assert only.outputs[-1].rules == rules.ending([EOS]) and only.outputs[-1].written == 0

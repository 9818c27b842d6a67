"""Lockstep rounds: concurrent requests verify together, and nobody waits for a request that is gone."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

import coordinator.__main__ as coordinator_cli
from calispec_core.errors import InvalidArgument
from calispec_core.generation import Mode
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Deadline
from coordinator import lockstep as lockstep_module
from coordinator.circuit import CircuitBreaker
from coordinator.config import CoordinatorConfig
from coordinator.cost_model import CostCurve, CostModel
from coordinator.engine import Orchestrator, SpeculationConfig
from coordinator.lockstep import Lockstep, RoundStart
from coordinator.round_plan import Wish, group_phase, median_cap, shared_phase
from tests.helpers import wait_until
from tests.unit.fakes import EOS, CharTokenizer, FakeDraft, FakeTarget
from tests.unit.test_circuit import Clock
from tests.unit.test_orchestrator import alphabet_target, params, sloppy_draft


def test_a_lone_request_never_waits() -> None:
    lockstep = Lockstep(max_wait_s=600)

    def two_round_starts() -> None:
        assert lockstep.start_round("a", timeout_s=600, wish=Wish(4)) == RoundStart(4, 1)  # nobody else: its own wish
        assert lockstep.before_verify("a", timeout_s=600) == 1  # verifies alone
        lockstep.start_round("a", timeout_s=600, wish=Wish(4))

    rounds = threading.Thread(target=two_round_starts)
    rounds.start()
    assert _ends(rounds)  # held at a gate, it would wait there for 600 s
    assert lockstep.waiting() == 0


def _in_thread(gate: Callable[..., object], member: str, *more: int) -> threading.Thread:
    thread = threading.Thread(target=gate, args=(member, 60, *more))
    thread.start()
    return thread


def _ends(thread: threading.Thread) -> bool:
    thread.join(timeout=30)
    return not thread.is_alive()


def _together(gate: Callable[..., object], *more: object) -> None:
    """ "a" and "b" through `gate` at once (each waits for the other)."""
    threads = [_in_thread(gate, member, *more) for member in ("a", "b")]
    assert all(_ends(t) for t in threads)


def _group_of_two() -> Lockstep:
    """ "a" and "b" both in the group, drafting."""
    lockstep = Lockstep(max_wait_s=60)
    lockstep.start_round("a", timeout_s=60, wish=Wish(4))  # alone: starts at once
    assert lockstep.start_round("b", timeout_s=60, wish=Wish(4)) == RoundStart(0, 1)  # joins "a"'s verify
    _together(lockstep.before_verify)
    _together(lockstep.start_round, Wish(4))
    assert lockstep.members() == 2
    return lockstep


def test_a_round_starts_when_every_member_is_ready_and_verifies_when_every_member_proposed() -> None:
    lockstep = _group_of_two()
    a = _in_thread(lockstep.before_verify, "a")
    wait_until(lambda: lockstep.waiting() == 1, interval_s=0.001)
    assert a.is_alive()  # held until "b" has its proposal
    lockstep.before_verify("b", timeout_s=60)
    assert _ends(a)
    assert lockstep.waiting() == 0


def test_a_newcomer_joins_the_drafting_rounds_verify_at_once() -> None:
    """Its row fills the round's verify (γ 0: its first token) instead of staying empty until the round ends."""
    lockstep = Lockstep(max_wait_s=60)
    lockstep.start_round("a", timeout_s=60, wish=Wish(4))  # "a" is drafting
    assert lockstep.start_round("b", timeout_s=60, wish=Wish(4)) == RoundStart(0, 1)  # at once: nothing to draft
    assert lockstep.members() == 2
    b = _in_thread(lockstep.before_verify, "b")
    wait_until(lambda: lockstep.waiting() == 1, interval_s=0.001)
    assert b.is_alive()  # the verify waits for "a"'s proposal
    assert lockstep.before_verify("a", timeout_s=60) == 2  # one batch of both
    assert _ends(b)


def test_a_reproducible_newcomer_waits_for_the_next_round_start_with_its_own_gamma() -> None:
    """A seeded sampling request joined a drafting round with γ 0 when it came while others drafted: its draws
    then followed another sequence of rounds, and its output changed under load (found by probing)."""
    lockstep = Lockstep(max_wait_s=60)
    lockstep.start_round("a", timeout_s=60, wish=Wish(4))  # "a" is drafting
    starts: dict[str, RoundStart] = {}
    b = threading.Thread(
        target=lambda: starts.update(b=lockstep.start_round("b", 60, Wish.fixed(3, reproducible=True)))
    )
    b.start()
    b.join(timeout=0.2)
    assert b.is_alive() and lockstep.members() == 1  # not in "a"'s round
    assert lockstep.before_verify("a", timeout_s=60) == 1  # "a" verifies alone
    a = threading.Thread(target=lambda: starts.update(a=lockstep.start_round("a", 60, Wish(4))))
    a.start()
    assert _ends(a) and _ends(b)
    assert starts == {"a": RoundStart(4, 2), "b": RoundStart(3, 2)}  # the next round, together, b at its own γ


def test_a_reproducible_newcomer_is_waited_for_by_members_back_from_verify_first() -> None:
    """Woken by the verify gate, it could find the members back first: they opened the round start without it, and
    it waited a whole newcomer wait to go alone (found by review). It is a member from that gate on."""
    lockstep = Lockstep(max_wait_s=60)
    lockstep.start_round("a", timeout_s=60, wish=Wish(4))  # "a" is drafting
    starts: dict[str, RoundStart] = {}
    seeded = Wish.fixed(3, reproducible=True)
    b = threading.Thread(target=lambda: starts.update(b=lockstep.start_round("b", 60, seeded)))
    with lockstep._state:  # "a" holds the lock from its verify to its next round start: "b" wakes after both
        b.start()
        while "b" not in lockstep._awaiting:
            lockstep._state.wait(0.01)  # lets "b" in, to wait for the verify
        assert lockstep.before_verify("a", timeout_s=60) == 1
        assert lockstep.members() == 2  # "b" is one now: the round start waits for it
        starts["a"] = lockstep.start_round("a", 60, Wish(4))  # (its wait lets "b" in)
    assert _ends(b)
    assert starts == {"a": RoundStart(4, 2), "b": RoundStart(3, 2)}


def test_a_reproducible_newcomer_goes_alone_with_its_own_gamma_if_the_round_outlasts_its_wait() -> None:
    lockstep = Lockstep(max_wait_s=0.01)
    lockstep.start_round("a", timeout_s=60, wish=Wish(4))  # "a" drafts on, past the newcomer's wait
    assert lockstep.start_round("b", timeout_s=60, wish=Wish.fixed(3, reproducible=True)) == RoundStart(3, 1)
    assert lockstep.before_verify("b", timeout_s=60) == 1  # out of step: verifies at once


def test_a_newcomer_at_the_verify_gate_waits_for_the_drafting_members_and_leaves_nobody_behind() -> None:
    """Drafting at batch 8 can outlast max_wait_s: a joiner's wait at the verify gate is a newcomer's, or its
    timeout would leave every drafting member behind."""
    lockstep = Lockstep(max_wait_s=0.01)
    lockstep.start_round("a", timeout_s=60, wish=Wish(4))  # "a" drafts, for much longer than max_wait_s
    lockstep._round_s = 60.0  # as if the last whole round had taken a minute
    lockstep.start_round("b", timeout_s=60, wish=Wish(4))
    b = _in_thread(lockstep.before_verify, "b")
    b.join(timeout=0.5)  # 50x max_wait_s
    assert b.is_alive() and lockstep.members() == 2  # waiting for "a", which is busy, not late
    assert lockstep.before_verify("a", timeout_s=60) == 2
    assert _ends(b)


def test_a_member_leaving_releases_those_waiting_for_it() -> None:
    lockstep = _group_of_two()
    a = _in_thread(lockstep.before_verify, "a")
    wait_until(lambda: lockstep.waiting() == 1, interval_s=0.001)
    lockstep.leave("b")  # "b" ended (finished, failed or cancelled)
    assert _ends(a)


def test_the_last_member_leaving_mid_round_reopens_the_round_start() -> None:
    """A lone member that failed while drafting left the gate shut: every later request then waited
    as a newcomer for a round nobody would end, ran out of step, and never joined a group again."""
    lockstep = Lockstep(max_wait_s=60)
    lockstep.start_round("a", timeout_s=60, wish=Wish(4))  # alone: drafting
    lockstep.leave("a")  # its Propose raised
    b = _in_thread(lockstep.start_round, "b", Wish(4))
    assert _ends(b)  # before: held for max_wait_s, then out of step
    assert lockstep.members() == 1
    assert lockstep.before_verify("b", timeout_s=60) == 1  # in step: it passes its own verify gate


def test_a_newcomer_whose_round_loses_its_last_drafter_verifies_at_once() -> None:
    lockstep = Lockstep(max_wait_s=60)
    lockstep.start_round("a", timeout_s=60, wish=Wish(4))
    lockstep.start_round("b", timeout_s=60, wish=Wish(4))  # joins "a"'s verify
    b = _in_thread(lockstep.before_verify, "b")
    wait_until(lambda: lockstep.waiting() == 1, interval_s=0.001)
    lockstep.leave("a")  # its Propose raised
    assert _ends(b)
    assert lockstep.members() == 1


def test_a_straggler_is_left_behind_and_rejoins_at_a_round_start() -> None:
    lockstep = _group_of_two()
    lockstep.max_wait_s = 0.01
    lockstep.before_verify("a", timeout_s=60)  # "b" never comes: "a" goes after max_wait_s
    assert lockstep.members() == 1
    lockstep.before_verify("b", timeout_s=60)  # out of step now: passes at once
    lockstep.max_wait_s = 60
    b = _in_thread(lockstep.start_round, "b", Wish(4))  # a newcomer again
    wait_until(lambda: lockstep.members() == 2, interval_s=0.001)
    lockstep.start_round("a", timeout_s=60, wish=Wish(4))
    assert _ends(b)  # together again


def test_a_newcomer_waits_for_the_round_in_progress_and_leaves_nobody_behind() -> None:
    """A newcomer arriving while the group verifies waits for the round, not max_wait_s: before, its
    timeout left every verifying member behind and the group ran split (verifying at batch 8 under the
    AVX2 caps takes longer than the 0.5 s default)."""
    lockstep = Lockstep(max_wait_s=0.01)
    lockstep.start_round("a", timeout_s=60, wish=Wish(4))  # alone: starts at once
    lockstep.before_verify("a", timeout_s=60)  # "a" verifies, for much longer than max_wait_s
    lockstep._round_s = 60.0  # as if the last whole round had taken a minute
    b = _in_thread(lockstep.start_round, "b", Wish(4))
    b.join(timeout=0.5)  # 50x max_wait_s: before, "b" had started a round of its own by now
    assert b.is_alive() and lockstep.members() == 2  # waiting for "a", which is busy, not late
    lockstep.start_round("a", timeout_s=60, wish=Wish(4))
    assert _ends(b) and lockstep.members() == 2  # the round starts with both


def test_a_round_start_plans_every_member_at_once_and_counts_the_drafters() -> None:
    """The planner sees the wish of every member starting the round; each gets its own γ of that plan, and
    the Propose cohort counts the members planned to draft."""
    seen: list[list[int]] = []

    def plan(wishes: Sequence[Wish]) -> list[int]:
        gammas = [w.gamma for w in wishes]
        seen.append(sorted(gammas))
        return [0 if g == 0 else 2 for g in gammas]  # whoever wished to draft drafts 2

    lockstep = Lockstep(max_wait_s=60, plan=plan)
    assert lockstep.start_round("a", timeout_s=60, wish=Wish(5)) == RoundStart(2, 1)  # alone: its own plan
    starts: dict[str, RoundStart] = {}
    wishes = {"a": 5, "b": 0, "c": 1}

    def start(member: str) -> None:
        starts[member] = lockstep.start_round(member, 60, Wish(wishes[member]))

    for member in ("b", "c"):  # join the round "a" drafts: at once, nothing to draft
        assert lockstep.start_round(member, 60, Wish(wishes[member])) == RoundStart(0, 1)
    verifying = [_in_thread(lockstep.before_verify, m) for m in ("a", "b", "c")]
    assert all(_ends(t) for t in verifying)
    starting = [threading.Thread(target=start, args=(m,)) for m in ("a", "b", "c")]
    for thread in starting:
        thread.start()
    assert all(_ends(t) for t in starting)
    assert seen == [[5], [0, 1, 5]]  # one plan per round start, over everyone starting it
    assert starts == {"a": RoundStart(2, 2), "b": RoundStart(0, 2), "c": RoundStart(2, 2)}


@pytest.mark.parametrize("broken", ["raises", "short"])
def test_a_failing_round_plan_gives_each_member_its_own_wish_and_shuts_no_gate(
    broken: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in a rule costs that round's plan: before, the exception escaped from the gate it opened, which
    stayed shut for the other members (they waited out max_wait_s, 60 s here, and met the same error)."""

    def plan(wishes: Sequence[Wish]) -> list[int]:
        if len(wishes) < 2:
            return [w.gamma for w in wishes]
        if broken == "raises":
            raise ZeroDivisionError("a bug in the rule")
        return [1]  # one γ for two members

    lockstep = Lockstep(max_wait_s=60, plan=plan)
    lockstep.start_round("a", timeout_s=60, wish=Wish(5))
    lockstep.start_round("b", timeout_s=60, wish=Wish(3))  # joins "a"'s verify
    _together(lockstep.before_verify)
    starts: dict[str, RoundStart] = {}
    b = threading.Thread(target=lambda: starts.update(b=lockstep.start_round("b", 60, Wish(3))))
    b.start()
    wait_until(lambda: lockstep.waiting() == 1, interval_s=0.001)
    with caplog.at_level("ERROR", logger="coordinator.lockstep"):
        starts["a"] = lockstep.start_round("a", timeout_s=60, wish=Wish(5))
    assert _ends(b)
    assert starts == {"a": RoundStart(5, 2), "b": RoundStart(3, 2)}
    assert "round plan failed" in caplog.text


def test_the_verify_gate_says_how_many_verify_together_and_a_straggler_goes_alone() -> None:
    """The count becomes the Verify calls' cohort: the target batches exactly the group's rows."""
    lockstep = _group_of_two()
    counts: dict[str, int] = {}
    a = threading.Thread(target=lambda: counts.update(a=lockstep.before_verify("a", 60)))
    a.start()
    wait_until(lambda: lockstep.waiting() == 1, interval_s=0.001)
    counts["b"] = lockstep.before_verify("b", timeout_s=60)
    assert _ends(a) and counts == {"a": 2, "b": 2}
    lockstep.max_wait_s = 0.01  # "b" does not come back in time:
    assert lockstep.start_round("a", timeout_s=60, wish=Wish(4)) == RoundStart(4, 1)  # "a" drafts alone...
    assert lockstep.before_verify("a", timeout_s=60) == 1  # ...and verifies alone
    assert lockstep.before_verify("b", timeout_s=60) == 1  # "b", out of step, too


def test_each_target_replica_is_told_only_its_own_rows() -> None:
    """Members spread over replicas: a replica told the whole group's count waited 50 ms every round for
    rows that went to the other one."""
    lockstep = _group_of_two()
    counts: dict[str, int] = {}
    a = threading.Thread(target=lambda: counts.update(a=lockstep.before_verify("a", 60, "replica-1")))
    a.start()
    wait_until(lambda: lockstep.waiting() == 1, interval_s=0.001)
    counts["b"] = lockstep.before_verify("b", timeout_s=60, shard="replica-2")
    assert _ends(a) and counts == {"a": 1, "b": 1}


def test_the_coordinator_names_each_requests_replica_at_the_verify_gate() -> None:
    draft, target = FakeDraft(sloppy_draft), FakeTarget(alphabet_target)
    orchestrator = Orchestrator(CharTokenizer(), draft, [target], (EOS,), max_context=4096)
    shards: list[object] = []
    original = orchestrator.lockstep.before_verify
    orchestrator.lockstep.before_verify = lambda member, timeout, shard=None: (  # type: ignore[method-assign]
        shards.append(shard) or original(member, timeout, shard)
    )
    list(orchestrator.generate("c", params(num_speculative_tokens=3, max_new_tokens=6), Deadline(60)))
    assert shards and set(shards) == {target.address}


def test_without_lockstep_the_gates_give_no_cohort() -> None:
    lockstep = Lockstep(max_wait_s=0)
    assert lockstep.start_round("a", timeout_s=60, wish=Wish(3)) == RoundStart(3, 0)
    assert lockstep.before_verify("a", timeout_s=60) == 0  # no hint: the service goes by its own history


def test_negative_wait_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        Lockstep(max_wait_s=-1)


class SlowFirstDraft(FakeDraft):
    """The first request's first proposal lasts until the second request is held by lockstep (or,
    without it, has finished two rounds of its own): the drift lockstep removes."""

    def __init__(self, target: FakeTarget) -> None:
        super().__init__(sloppy_draft)
        self.target = target
        self.lockstep: Lockstep | None = None
        self.slow_in_propose = threading.Event()
        self.rounds_of_fast_meanwhile: int | None = None

    def propose(self, session_id, num_tokens, rollback_to, append, timeout, *early_stop, **hints):
        if session_id == "slow" and self.rounds_of_fast_meanwhile is None:
            lockstep = self.lockstep
            assert lockstep is not None
            self.slow_in_propose.set()
            wait_until(lambda: lockstep.waiting() == 1 or self.target.verifies["fast"] >= 2, interval_s=0.001)
            self.rounds_of_fast_meanwhile = self.target.verifies["fast"]
        return super().propose(session_id, num_tokens, rollback_to, append, timeout, *early_stop, **hints)


class CountingTarget(FakeTarget):
    def __init__(self) -> None:
        super().__init__(alphabet_target)
        self.verifies: Counter[str] = Counter()

    def verify(self, session_id, proposal, timeout, cohort=0, logprobs=None):
        verdict = super().verify(session_id, proposal, timeout, cohort, logprobs)
        self.verifies[session_id] += 1
        return verdict


def _rounds_of_one_request_during_the_first_round_of_another(
    lockstep_wait_s: float,
) -> tuple[int, list[int], list[int]]:
    """(rounds "fast" ran meanwhile, the cohort of every Propose, of every Verify)."""
    target = CountingTarget()
    draft = SlowFirstDraft(target)
    speculation = SpeculationConfig(lockstep_wait_s=lockstep_wait_s)
    orchestrator = Orchestrator(CharTokenizer(), draft, [target], (EOS,), max_context=4096, speculation=speculation)
    draft.lockstep = orchestrator.lockstep
    request_ids = iter(["slow", "fast"])  # a request's first sessions are named after it
    original = orchestrator._new_request

    def named(*args, **kwargs):
        request = original(*args, **kwargs)
        request.request_id = next(request_ids)
        return request

    orchestrator._new_request = named  # type: ignore[method-assign]
    outputs: dict[str, str] = {}

    def client(name: str) -> None:
        chunks = orchestrator.generate("c", params(num_speculative_tokens=3, max_new_tokens=12), Deadline(60))
        outputs[name] = "".join(c.text for c in chunks)

    slow = threading.Thread(target=client, args=("slow",))
    slow.start()
    assert draft.slow_in_propose.wait(timeout=30)  # in its first round
    fast = threading.Thread(target=client, args=("fast",))
    fast.start()
    for thread in (slow, fast):
        thread.join(timeout=60)
    assert outputs == {"slow": "defghijklmno", "fast": "defghijklmno"}
    assert draft.rounds_of_fast_meanwhile is not None
    return draft.rounds_of_fast_meanwhile, draft.cohorts, target.cohorts


def test_no_request_starts_a_round_while_another_is_mid_round() -> None:
    rounds, propose_cohorts, verify_cohorts = _rounds_of_one_request_during_the_first_round_of_another(60)
    assert rounds == 0
    # the calls carry their cohort: two once both are in step (so the services batch them whole), one
    # alone. Both in step at all: "fast" joins at the verify gate of "slow"'s round; it used to add itself
    # only when its thread woke, and "slow", back at once from the fakes' instant verify, started every
    # round without it (all cohorts 1)
    assert set(propose_cohorts) == {1, 2} and set(verify_cohorts) == {1, 2}


def test_without_lockstep_requests_drift_apart() -> None:
    """The scenario above does drift without the barrier (so the test above can fail)."""
    rounds, propose_cohorts, verify_cohorts = _rounds_of_one_request_during_the_first_round_of_another(0)
    assert rounds >= 2
    assert set(propose_cohorts) == {0} and set(verify_cohorts) == {0}  # no hint: the services' own history


def test_the_coordinator_cli_maps_lockstep_wait_onto_the_orchestrator() -> None:
    base = ["--draft-addr", "127.0.0.1:1", "--target-addr", "127.0.0.1:2", "--tokenizer", "t"]
    assert coordinator_cli.parse_config(base)[0].lockstep_wait_s == 0.5
    with pytest.raises(SystemExit):  # a usage error at start-up, not a failure once services are connected
        coordinator_cli.parse_config([*base, "--lockstep-wait", "-1"])
    config, _ = coordinator_cli.parse_config([*base, "--lockstep-wait", "0"])
    assert config.lockstep_wait_s == 0.0
    speculation = SpeculationConfig(lockstep_wait_s=config.lockstep_wait_s)
    orchestrator = Orchestrator(CharTokenizer(), FakeDraft(sloppy_draft), [FakeTarget(alphabet_target)], (EOS,), 4096,
                                speculation=speculation)  # fmt: skip
    assert orchestrator.lockstep.max_wait_s == 0.0


def test_a_finished_request_leaves_the_group_before_its_last_chunk() -> None:
    """A consumer may never ask past the last chunk (an HTTP stream whose first chunk is its last): the
    request stayed a member until its generator was collected, and the others waited for it at every
    round start."""
    orchestrator = Orchestrator(CharTokenizer(), FakeDraft(sloppy_draft), [FakeTarget(alphabet_target)], (EOS,), 4096)
    stream = orchestrator.generate("c", params(num_speculative_tokens=3, max_new_tokens=1), Deadline(60))
    last = next(stream)
    assert last.finish_reason is not None
    assert orchestrator.lockstep.members() == 0
    stream.close()


def test_a_member_the_open_draft_circuit_skips_is_no_drafter_of_its_round() -> None:
    """It used to wish its γ at the round start, so the round's Propose cohort counted it: the draft's
    batcher then waited up to 50 ms for a row that never came (each time a probe went out alone)."""
    draft, target = FakeDraft(sloppy_draft), FakeTarget(alphabet_target)
    speculation = SpeculationConfig(lockstep_wait_s=60)
    circuit = CircuitBreaker(clock=Clock())  # time stands still: the backoff never passes
    orchestrator = Orchestrator(CharTokenizer(), draft, [target], (EOS,), 4096, circuit, speculation=speculation)
    orchestrator.draft_circuit.failed()  # open, backing off: every round skips the draft
    wishes: list[int] = []
    start_round = orchestrator.lockstep.start_round

    def recording(member, timeout_s, wish):
        wishes.append(wish.gamma)
        return start_round(member, timeout_s, wish)

    orchestrator.lockstep.start_round = recording  # type: ignore[method-assign]
    chunks = list(orchestrator.generate("c", params(num_speculative_tokens=3, max_new_tokens=6), Deadline(60)))
    assert "".join(c.text for c in chunks) == "defghi" and chunks[-1].stats.draft_unavailable_rounds == 5
    assert wishes == [0] * 6 and draft.cohorts == []


def test_the_coordinator_takes_each_rounds_gamma_from_the_round_start() -> None:
    """Adaptive requests bring how far they may draft; the γ each drafts is the round start's, whatever its own
    policy chose."""
    draft, target = FakeDraft(sloppy_draft), FakeTarget(alphabet_target)
    speculation = SpeculationConfig(lockstep_wait_s=60, max_gamma=4, lockstep_phase="shared")
    orchestrator = Orchestrator(CharTokenizer(), draft, [target], (EOS,), 4096, speculation=speculation)
    assert orchestrator.lockstep.plan is shared_phase
    wishes: list[Wish] = []

    def two_each(group: list[Wish]) -> list[int]:
        wishes.extend(group)
        return [min(2, w.limit) for w in group]

    orchestrator.lockstep.plan = two_each
    chunks = list(orchestrator.generate("c", params(num_speculative_tokens=None, max_new_tokens=7), Deadline(60)))
    assert "".join(c.text for c in chunks) == "defghij"
    assert all(w.adaptive for w in wishes)
    assert [w.limit for w in wishes][:1] == [4]  # max_gamma, while the budget leaves room for more
    assert [len(p) for p in draft.proposals] == [min(2, w.limit) for w in wishes if w.limit]
    median = SpeculationConfig(lockstep_phase="median")
    assert Orchestrator(CharTokenizer(), draft, [target], (EOS,), 4096, speculation=median).lockstep.plan is median_cap


def test_the_group_phase_plans_with_the_coordinators_costs_and_each_members_acceptance() -> None:
    """The default rule: round_plan.group_phase over the orchestrator's own cost model, and each
    adaptive member brings its acceptance (what the plan prices)."""
    draft, target = FakeDraft(sloppy_draft), FakeTarget(alphabet_target)
    speculation = SpeculationConfig(lockstep_wait_s=60, max_gamma=4)  # the default rule
    orchestrator = Orchestrator(CharTokenizer(), draft, [target], (EOS,), 4096, speculation=speculation)
    plan = orchestrator.lockstep.plan
    assert plan.func is group_phase and plan.args == (orchestrator.costs,)  # type: ignore[attr-defined]
    wishes: list[Wish] = []

    def recording(group: list[Wish]) -> list[int]:
        wishes.extend(group)
        return plan(group)

    orchestrator.lockstep.plan = recording
    chunks = list(orchestrator.generate("c", params(num_speculative_tokens=None, max_new_tokens=7), Deadline(60)))
    assert "".join(c.text for c in chunks) == "defghij"
    drafting = [w for w in wishes if w.limit]
    assert drafting and all(w.alpha is not None and 0.0 < w.alpha < 1.0 for w in drafting)
    lockstep = SpeculationConfig(lockstep_wait_s=60, lockstep_phase="median")
    without = Orchestrator(CharTokenizer(), draft, [target], (EOS,), 4096, speculation=lockstep)
    member = SimpleNamespace(policy=SimpleNamespace(probing=False), use_draft=True, draft_session="d")
    assert without._wish(member, 1, 9, False).alpha is None  # other rules price nothing


def test_a_group_phase_never_leaves_the_draft_circuits_probe_out() -> None:
    """While the draft circuit is open one request probes the draft; the others may not draft. A group plan that
    priced the lone prober's drafts as not worth the round's draft steps planned it 0, no Propose was sent, and the
    circuit waited for that probe until it expired (60 s) with the draft off for everyone. The probe's floor is
    its wish, so every rule plans it, and a round that still leaves it out frees the probe for the next request."""
    costs = CostModel(CostCurve.of({1: 213.0, 16: 215.0, 64: 290.0}), CostCurve.of({1: 35.0, 8: 50.0}))
    speculation = SpeculationConfig(lockstep_wait_s=60, max_gamma=4)
    orchestrator = Orchestrator(
        CharTokenizer(), FakeDraft(sloppy_draft), [FakeTarget(alphabet_target)], (EOS,), 4096, speculation=speculation,
        costs=costs,
    )  # fmt: skip
    orchestrator.draft_circuit.failed()  # open
    policy = SimpleNamespace(probing=False, tracker=SimpleNamespace(alphas=lambda n: [0.3] * n))
    prober = orchestrator._wish(SimpleNamespace(policy=policy, use_draft=True, draft_session="d"), 2, 9, True)
    others = [orchestrator._wish(SimpleNamespace(policy=policy, use_draft=True, draft_session="d"), 0, 9, False)] * 7
    assert group_phase(costs, [prober, *others]) == [2] + [0] * 7


def test_the_command_line_chooses_the_lockstep_phase(tmp_path: Path) -> None:
    base = ["--draft-addr", "d:1", "--target-addr", "t:1", "--tokenizer", "x"]
    assert coordinator_cli.parse_config(base)[0].lockstep_phase == "group"  # the default since wave 38
    for rule in ("median", "shared", "group"):
        assert coordinator_cli.parse_config([*base, "--lockstep-phase", rule])[0].lockstep_phase == rule
    with pytest.raises(SystemExit):
        coordinator_cli.parse_config([*base, "--lockstep-phase", "fastest"])
    with pytest.raises(ValueError, match="lockstep_phase"):
        CoordinatorConfig("127.0.0.1:1", ("127.0.0.1:2",), tmp_path, lockstep_phase="fastest")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="lockstep_phase"):  # not a KeyError at the first round start
        SpeculationConfig(lockstep_phase="fastest")  # type: ignore[arg-type]


def test_no_early_stop_in_a_shared_draft_phase() -> None:
    """A phase of several drafting members runs as long as its longest proposal: an early stop there saves one
    row's verified tokens, not draft steps. Alone, or under wave 6's rule, adaptive proposals stop early."""
    adaptive, fixed = SimpleNamespace(policy=object()), SimpleNamespace(policy=None)
    shared = Orchestrator(
        CharTokenizer(), FakeDraft(sloppy_draft), [FakeTarget(alphabet_target)], (EOS,), 4096,
        speculation=SpeculationConfig(lockstep_phase="shared"),
    )  # fmt: skip
    threshold = shared.speculation.draft_min_confidence
    assert threshold > 0
    assert [shared._early_stop(adaptive, cohort) for cohort in (0, 1, 2, 8)] == [threshold, threshold, 0.0, 0.0]
    assert shared._early_stop(fixed, 1) == 0.0  # a fixed γ never stops early
    wave6 = Orchestrator(
        CharTokenizer(), FakeDraft(sloppy_draft), [FakeTarget(alphabet_target)], (EOS,), 4096,
        speculation=SpeculationConfig(lockstep_phase="median"),
    )  # fmt: skip
    assert wave6._early_stop(adaptive, 8) == threshold
    group = Orchestrator(  # the default rule: the group phase
        CharTokenizer(), FakeDraft(sloppy_draft), [FakeTarget(alphabet_target)], (EOS,), 4096,
    )  # fmt: skip
    assert [group._early_stop(adaptive, cohort) for cohort in (1, 2, 8)] == [threshold, 0.0, 0.0]


def test_what_a_request_brings_to_the_round_start() -> None:
    """How far the shared phase may raise a member: its room and max_gamma normally; no further than its own wish
    while the draft circuit is open (only a probe calls the draft) or while it has no draft session (opening one
    inside the round would hold the group); a probe at least its own γ; a fixed γ exactly (the median rule: no
    acceptance brought, which the group phase adds)."""
    speculation = SpeculationConfig(lockstep_wait_s=60, max_gamma=4, lockstep_phase="median")
    orchestrator = Orchestrator(
        CharTokenizer(), FakeDraft(sloppy_draft), [FakeTarget(alphabet_target)], (EOS,), 4096, speculation=speculation
    )

    def request(probing: bool = False, session: str | None = "d", policy: bool = True) -> SimpleNamespace:
        return SimpleNamespace(
            policy=SimpleNamespace(probing=probing) if policy else None,
            use_draft=True,
            draft_session=session,
            params=params(),
        )

    wish = orchestrator._wish
    assert wish(request(), 0, room=9, probing=False) == Wish(0, True, 4, 0)  # max_gamma; not drafting: no reach
    assert wish(request(), 2, room=9, probing=False) == Wish(2, True, 4, 0, 4)  # alone it may draft that far
    assert wish(request(), 1, room=2, probing=False) == Wish(1, True, 2, 0, 2)  # tokens left
    assert wish(request(probing=True), 2, room=9, probing=False) == Wish(2, True, 4, 2)  # a probe reaches no further
    assert wish(request(session=None), 0, room=9, probing=False) == Wish(0, True, 0, 0)
    assert wish(request(policy=False), 3, room=9, probing=False) == Wish.fixed(3)
    seeded = SimpleNamespace(policy=None, use_draft=True, params=params(sampling=SamplingConfig(1.0, seed=7)))
    assert wish(seeded, 3, room=9, probing=False) == Wish.fixed(3, reproducible=True)  # never joins a round at γ 0
    assert wish(seeded, 0, room=9, probing=False) == Wish.fixed(0)  # a γ 0 round is the same whenever it runs
    for mode in (Mode.CSD, Mode.OCM_ONLY, Mode.SCG_ONLY):  # only a drafted token is rescued: which are drafted counts
        rescuing = SimpleNamespace(policy=None, use_draft=True, params=params(mode=mode))
        assert wish(rescuing, 3, room=9, probing=False) == Wish.fixed(3, reproducible=True)
    orchestrator.draft_circuit.failed()  # open: only a probe calls the draft
    assert wish(request(), 0, room=9, probing=False) == Wish(0, True, 0, 0)
    # the draft circuit's probe drafts its wish whatever the plan: left out, it would hold the draft off (wave 37)
    assert wish(request(), 2, room=9, probing=True) == Wish(2, True, 2, 2, 2)


class _Clock:
    """The lockstep's clock, real time plus what the test skips (idle time that never passes in the test)."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.skipped


def test_a_newcomer_waits_for_a_typical_rounds_work_not_for_idle_time_or_a_slow_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A newcomer waits max_wait_s plus twice a round: the last round was measured start to next start, across idle
    time, so after 20 s idle a request waited 40 s for a member that was not coming, and that wait lengthened the
    next newcomer's (found by probing: a streamed n=2 stalled every request up to its 60 s timeout); a member whose
    client reads slowly paced the rounds, and so the newcomers' waits (found by probing the fix). A round's work is
    now its start to its first verdict, and a typical round the median of the last ones."""
    clock = _Clock()
    monkeypatch.setattr(lockstep_module, "time", clock)
    lockstep = Lockstep(max_wait_s=0.5)
    wish = Wish(gamma=2, limit=6)

    def round_of(work_s: float, then_s: float) -> None:
        lockstep.start_round("a", 10, wish)
        lockstep.before_verify("a", 10)
        clock.skipped += work_s
        lockstep.verified("a")
        clock.skipped += then_s  # back to the next round start: its client's pace, or idle time

    for _ in range(3):
        round_of(0.1, 0.0)
    round_of(0.1, 20.0)  # then idle (or a client that reads every 20 s)
    lockstep.start_round("a", 10, wish)  # the next round: a newcomer arriving now waits...
    assert lockstep._newcomer_wait_s() == pytest.approx(0.5 + 2 * 0.1, abs=0.05)
    lockstep.before_verify("a", 10)
    clock.skipped += 30.0  # one round's long work (a long prefill rode in it)
    lockstep.verified("a")
    lockstep.verified("a")  # its first verdict only
    assert lockstep._newcomer_wait_s() == pytest.approx(0.5 + 2 * 0.1, abs=0.05)  # the median of the last ones
    for _ in range(3):
        round_of(3.0, 0.0)  # rounds that do take longer (a larger batch) are waited for
    assert lockstep._newcomer_wait_s() == pytest.approx(0.5 + 2 * 3.0, abs=0.05)

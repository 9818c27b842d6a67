"""γ for the members of a lockstep round: wave 6's cap, and the shared draft phase."""

from __future__ import annotations

from coordinator.cost_model import CostCurve, CostModel, GammaPolicy
from coordinator.round_plan import Wish, alone, median_cap, phase_length, shared_phase


def adaptive(gamma: int, limit: int = 10, floor: int = 0, reach: int = 0) -> Wish:
    return Wish(gamma, True, limit, floor, reach)


def test_the_phase_is_the_drafting_members_lower_median_wish() -> None:
    assert phase_length([adaptive(1), adaptive(3), adaptive(10), Wish.fixed(6), adaptive(0)]) == 3
    assert phase_length([adaptive(0), Wish.fixed(0)]) == 0  # nobody drafts: no phase
    assert phase_length([adaptive(4)]) == 4  # alone: its own wish


def test_wave6_rule_caps_only_the_adaptive_members() -> None:
    wishes = [adaptive(1), adaptive(3), adaptive(10), Wish.fixed(6), adaptive(0)]
    assert median_cap(wishes) == [1, 3, 3, 6, 0]


def test_every_adaptive_member_drafts_the_shared_phase_within_its_bounds() -> None:
    """Rows that would sit the phase out (or stop short) draft its length: wave 29's trace at concurrency 8 had
    rows whose drafts passed 70-80 % of the time at γ = 0 while code rows drafted 3 for the whole group."""
    wishes = [adaptive(3), adaptive(3), adaptive(0), adaptive(1), adaptive(0, limit=1), Wish.fixed(6), Wish.fixed(0)]
    assert shared_phase(wishes) == [3, 3, 3, 3, 1, 6, 0]  # the last adaptive row has one token of room left
    assert shared_phase([adaptive(0, limit=0), adaptive(2)]) == [0, 2]  # the draft circuit skips the first
    assert shared_phase([adaptive(0, floor=2), adaptive(1), adaptive(1)]) == [2, 1, 1]  # a probe keeps its floor


def test_nobody_drafts_unless_some_member_chose_to() -> None:
    assert shared_phase([adaptive(0)] * 8) == [0] * 8
    assert shared_phase([adaptive(0)] * 7 + [Wish.fixed(0)]) == [0] * 8


def test_a_fixed_gamma_member_draws_nobody_into_drafting() -> None:
    """A request that fixed γ (a seeded one gets 6) drafts what it asked; the adaptive rows' phase comes from their
    own wishes (counting it, seven rows whose cost model said no would have drafted 6 each)."""
    assert shared_phase([adaptive(0)] * 7 + [Wish.fixed(6)]) == [0] * 7 + [6]
    assert shared_phase([adaptive(2), adaptive(0), Wish.fixed(6)]) == [2, 2, 6]
    assert median_cap([adaptive(0)] * 7 + [Wish.fixed(6)]) == [0] * 7 + [6]  # wave 6: the same here


def test_a_lone_member_drafts_what_it_chose() -> None:
    for gamma in range(11):
        assert shared_phase([adaptive(gamma)]) == median_cap([adaptive(gamma)]) == [gamma]


def test_a_lone_member_that_drafts_reaches_as_far_as_its_path_floor_may_take_it() -> None:
    """Wave 33: alone, an adaptive member that chose to draft drafts up to its reach (within its limit) and lets
    the path floor stop the proposal; one that chose not to stays at 0; a fixed γ and any group keep the rule."""
    for plan in (median_cap, shared_phase):
        assert plan([adaptive(3, reach=10)]) == [10]
        assert plan([adaptive(3, limit=5, reach=10)]) == [5]  # its room
        assert plan([adaptive(0, reach=10)]) == [0]  # its cost model said no
        assert plan([adaptive(6, reach=4)]) == [6]  # never below its own choice
        assert plan([Wish(3, False, 3, 3, 10)]) == [3]  # a fixed γ is what the request asked
        assert plan([adaptive(3, reach=10), adaptive(3, reach=10)]) == [3, 3]  # a group waits for nobody's reach
    assert alone(adaptive(2, reach=0)) == 2  # no reach: its γ


def test_a_round_the_group_drafted_counts_as_measured_acceptance() -> None:
    """A member whose own policy said γ = 0 but whose round drafted for it learnt its acceptance there: its next
    probe waits a whole interval again."""
    costs = CostModel(CostCurve.of({1: 147.0, 8: 160.0, 17: 210.0}), CostCurve.of({1: 29.0}), draft_call_ms=3.0)
    policy = GammaPolicy(costs, max_gamma=10)
    policy.tracker.prior = 0.05  # alone it would not draft; better acceptance would pay: it probes now and then
    policy.tracker.examined = 8
    assert [policy.next_gamma() for _ in range(5)] == [0] * 5
    policy.observe(drafted=2, accepted=0)  # the shared phase drafted for it (both rejected)
    assert [policy.next_gamma() for _ in range(8)] == [0] * 8  # without the reset it probed after 3 more

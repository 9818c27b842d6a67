"""Which positions a greedy SD run turns into rejection events, on hand-built predictions."""

from __future__ import annotations

from calispec_tools.calibrate.corpus import windows
from calispec_tools.calibrate.teacher import Row, SdRule, dense_event_positions, row_events, sd_event_positions

EOS = 99


def preds(tokens: list[int], mismatches: set[int], draft_token: int = 50) -> tuple[list[int], list[int]]:
    """Target predictions = the text (the target wrote it); the draft differs at the given positions."""
    target = [*tokens[1:], 0]  # target[i - 1] predicts position i
    draft = [draft_token if i + 1 in mismatches else t for i, t in enumerate(target)]
    return draft, target


def test_rounds_skip_bonus_positions_and_restart_after_a_rejection() -> None:
    tokens = list(range(1, 21))  # a prompt of 2 tokens, then 18 generated
    row = Row(tokens, start=2, budget=18)
    # γ = 3, rounds: [2,3,4] all accepted -> bonus 5; [6,7,8] mismatch at 7 -> restart at 8;
    # [8,9,10] mismatch at 8 -> [9,10,11] accepted -> bonus 12; [13,14,15] mismatch at 15 -> [16,17,18]
    # accepted -> bonus 19 (g = min(3, 20 - 16 - 1) = 3); positions 5, 12 and 19 are bonus positions.
    mismatches = {5, 7, 8, 12, 15, 19}
    draft, target = preds(tokens, mismatches)
    assert sd_event_positions(draft, target, row, SdRule(3, frozenset())) == [7, 8, 15]
    assert dense_event_positions(draft, target, row) == sorted(mismatches)
    assert row_events(draft, target, row, "sd", SdRule(3, frozenset())) == [(50, 8), (50, 9), (50, 16)]


def test_the_budget_shrinks_the_last_rounds_to_a_plain_step() -> None:
    tokens = list(range(1, 9))
    row = Row(tokens, start=1, budget=7)  # positions 1..7
    # γ = 6: round 1 drafts g = min(6, 6) = 6 positions 1..6, all accepted, bonus 7: the end.
    draft, target = preds(tokens, {7})
    assert sd_event_positions(draft, target, row, SdRule(6, frozenset())) == []
    # a mismatch at 6 ends round 1 there; position 7 is then a plain step (g = 0): no event either
    draft, target = preds(tokens, {6, 7})
    assert sd_event_positions(draft, target, row, SdRule(6, frozenset())) == [6]


def test_the_run_ends_after_the_round_that_emits_eos_but_that_round_may_verify_past_it() -> None:
    tokens = [1, 2, EOS, 4, 5, 6, 7, 8, 9, 10]
    row = Row(tokens, start=1, budget=9)
    # round 1 (γ = 4): positions 1..4; EOS at 2 is accepted, the mismatch at 4 (past EOS) is still an event
    draft, target = preds(tokens, {4, 8})
    assert sd_event_positions(draft, target, row, SdRule(4, frozenset({EOS}))) == [4]
    assert sd_event_positions(draft, target, row, SdRule(4, frozenset())) == [4, 8]


def test_windows_overlap_by_one_token_so_every_position_is_predicted_once() -> None:
    ids = list(range(11))
    assert windows(ids, 4) == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9], [9, 10]]
    assert windows([7], 4) == [] and windows([1, 2], 4) == [[1, 2]]

"""Where a proposal stops on its path probability: the draft's side (the product of its tokens' probabilities
against the caller's floor) and the coordinator's (the floor the cost model derives, and when it is sent)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from calispec_core.errors import InvalidArgument
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Deadline, Stopwatch
from coordinator.__main__ import parse_config
from coordinator.config import CoordinatorConfig
from coordinator.cost_model import MAX_PATH_FLOOR, CostCurve, CostModel, expected_tokens
from coordinator.engine import Orchestrator, SpeculationConfig
from draft_service.proposer import Proposer
from tests.service.test_seeded_sampling import ConstantRunner
from tests.unit.fakes import EOS, CharTokenizer, FakeDraft, FakeTarget
from tests.unit.test_orchestrator import alphabet_target, params

SURE = [0.0, math.log(3.0)]  # every step: token 1 at probability 0.75, so a path of k tokens has 0.75 ** k


def propose(min_confidence: float = 0.0, min_path_confidence: float = 0.0) -> list[int]:
    proposer = Proposer(ConstantRunner(SURE), max_sessions=2)  # type: ignore[arg-type]
    try:
        proposer.prefill("a", [0], SamplingConfig(), Stopwatch())
        return proposer.propose("a", 6, None, [], Stopwatch(), min_confidence, 0, min_path_confidence).token_ids
    finally:
        proposer.stop()


def test_a_proposal_stops_after_the_token_that_takes_its_path_below_the_floor() -> None:
    assert propose(min_path_confidence=0.5) == [1, 1, 1]  # 0.75, 0.5625, then 0.42 < 0.5: kept, and stop
    assert propose(min_path_confidence=0.3) == [1] * 5  # 0.75 ** 5 = 0.237
    assert propose(min_path_confidence=0.0) == [1] * 6  # off
    assert propose(min_confidence=0.7, min_path_confidence=0.0) == [1] * 6  # each token alone is sure enough


@pytest.mark.parametrize("floor", [-0.1, 1.5, float("nan")])
def test_a_path_floor_outside_zero_one_is_refused(floor: float) -> None:
    with pytest.raises(InvalidArgument, match="min_path_confidence"):
        propose(min_path_confidence=floor)


def costs(draft_ms: float) -> CostModel:
    model = CostModel(CostCurve.of({1: 118.0, 11: 130.0}), CostCurve.of({1: draft_ms}), draft_call_ms=0.0)
    model.overhead_ms = 0.0
    return model


def test_the_floor_prices_one_more_draft_against_what_the_round_earns() -> None:
    model = costs(26.0)
    marginal = 26.0 + 1.2  # a draft step and one more verified token
    rate = expected_tokens(6, 0.85) / model.round_ms(6)
    assert model.path_confidence_floor(6, 0.85) == pytest.approx(marginal * rate / 0.85)
    assert 0.4 < model.path_confidence_floor(6, 0.85) < 0.6  # the bf16 VM's costs (docs/performance.md)
    assert model.path_confidence_floor(0, 0.85) == 0.0  # a plain step proposes nothing


def test_a_dearer_draft_stops_sooner_and_the_floor_is_capped() -> None:
    floors = [costs(ms).path_confidence_floor(6, 0.85) for ms in (5.0, 26.0, 60.0)]
    assert floors == sorted(floors) and floors[0] < floors[-1]
    assert costs(500.0).path_confidence_floor(1, 0.85) == MAX_PATH_FLOOR  # a draft dearer than the target
    assert costs(26.0).path_confidence_floor(3, [0.0, 0.0, 0.0]) == MAX_PATH_FLOOR
    assert costs(26.0).path_confidence_floor(3, [float("nan")] * 3) == MAX_PATH_FLOOR  # never a NaN the draft refuses
    with pytest.raises(ValueError, match="acceptance"):
        costs(26.0).path_confidence_floor(3, [0.8])  # fewer acceptances than positions


def orchestrator(**speculation: object) -> Orchestrator:
    return Orchestrator(
        CharTokenizer(), FakeDraft(alphabet_target), [FakeTarget(alphabet_target)], (EOS,), 4096,
        speculation=SpeculationConfig(**speculation),  # type: ignore[arg-type]
    )  # fmt: skip


def test_adaptive_requests_send_the_cost_models_floor_and_fixed_ones_zero(monkeypatch) -> None:
    auto = orchestrator()
    asked: list[int] = []

    def floor(gamma: int, alphas: list[float], batch: float | None = None) -> float:
        asked.append(gamma)
        return 0.123  # a value no default could send

    monkeypatch.setattr(auto.costs, "path_confidence_floor", floor)
    list(auto.generate("a", params(num_speculative_tokens=None, max_new_tokens=8), Deadline(60)))
    draft = auto.draft
    assert isinstance(draft, FakeDraft) and draft.early_stops
    assert set(draft.early_stops) == {(0.4, 0.123)}
    assert len(asked) == len(draft.proposals)  # one floor for each proposal
    fixed = orchestrator()
    list(fixed.generate("f", params(num_speculative_tokens=3, max_new_tokens=8), Deadline(60)))
    assert fixed.draft.early_stops and set(fixed.draft.early_stops) == {(0.0, 0.0)}  # type: ignore[attr-defined]


def lone_proposals(monkeypatch, **speculation: object) -> tuple[list[int], list[int]]:
    """A lone adaptive request whose policy always chooses γ = 2 (a perfect draft, 30 tokens): the lengths its
    proposals were asked for, and the γ each path floor was priced at."""
    auto = orchestrator(**speculation)
    priced: list[int] = []
    monkeypatch.setattr(auto.costs, "best_gamma", lambda *args, **kwargs: 2)
    monkeypatch.setattr(auto.costs, "path_confidence_floor", lambda gamma, *args: priced.append(gamma) or 0.123)
    list(auto.generate("a", params(num_speculative_tokens=None, max_new_tokens=30), Deadline(60)))
    return [len(p) for p in auto.draft.proposals], priced  # type: ignore[attr-defined]


def test_a_lone_request_drafts_to_its_reach_with_the_floor_priced_at_its_policys_gamma(monkeypatch) -> None:
    """Wave 33: alone, a request that drafts at all asks for up to max_gamma (its room allowing) and lets the path
    floor stop it, the floor still priced at the γ its policy chose (docs/performance.md, "Where a proposal
    stops"); --no-draft-to-floor, or no path floor, keeps the policy's γ."""
    lengths, priced = lone_proposals(monkeypatch)
    assert lengths == [10, 10, 7]  # 11 tokens a round, then the room left (30 - 22 - 1)
    assert priced == [2, 2, 2]
    assert lone_proposals(monkeypatch, draft_to_floor=False)[0] == [2] * 10
    assert lone_proposals(monkeypatch, draft_min_path_confidence=0.0)[0] == [2] * 10  # nothing would stop it
    assert lone_proposals(monkeypatch, lockstep_wait_s=0.0)[0] == [2] * 10  # lockstep off: nobody knows it is alone


def test_a_proposal_reaches_only_as_far_as_the_floors_price_holds() -> None:
    """Past γ as far as the further drafts cost on average at most REACH_SLACK times the draft that priced the floor:
    a flat verify curve (a GPU's) reaches the limit; one that bends up stops where it bends; one with a step (bf16
    oneDNN: 7 rows cost ~1.2x 6) reaches past it to the cheap positions after; a linear one (every token dear)
    prices every position alike, so the floor itself holds the proposal."""
    flat = costs(26.0)
    assert flat.path_reach(3, 10) == 10
    assert flat.path_reach(3, 2) == 3  # never below its γ
    assert flat.path_reach(0, 10) == 0  # a plain step drafts nothing
    bends = CostModel(CostCurve.of({1: 118.0, 5: 122.0, 8: 400.0}), CostCurve.of({1: 26.0}), draft_call_ms=0.0)
    assert bends.path_reach(2, 10) == 4  # a 5th draft would verify a 6th token, on the steep part
    step = CostModel(
        CostCurve.of({1: 118.0, 6: 118.0, 7: 140.0, 11: 150.0}), CostCurve.of({1: 26.0}), draft_call_ms=0.0
    )
    assert step.path_reach(2, 10) == 10  # the 6th draft costs 26 + 22 ms, the four after it 26 + 2.5 each
    bump = CostModel(
        CostCurve.of({1: 118.0, 3: 118.0, 4: 148.0, 11: 148.0}), CostCurve.of({1: 26.0}), draft_call_ms=0.0
    )
    assert bump.path_reach(2, 10) == 10  # the 3rd draft alone costs 56 ms, from the 5th on they average within 1.5x
    linear = CostModel(CostCurve.of({1: 100.0, 17: 1700.0}), CostCurve.of({1: 26.0}), draft_call_ms=0.0)
    assert linear.path_reach(1, 10) == 10


def test_a_configured_floor_is_sent_as_is_and_zero_in_a_shared_phase() -> None:
    adaptive = SimpleNamespace(policy=SimpleNamespace(tracker=SimpleNamespace(alphas=lambda n: [0.8] * n)))
    assert orchestrator(draft_min_path_confidence=0.3)._path_floor(adaptive, 4, 1) == 0.3  # type: ignore[arg-type]
    assert orchestrator(draft_min_path_confidence=0.0)._path_floor(adaptive, 4, 1) == 0.0  # type: ignore[arg-type]
    for shared in (orchestrator(lockstep_phase="shared"), orchestrator()):  # the default: group
        assert shared._path_floor(adaptive, 4, 8) == 0.0  # type: ignore[arg-type]
        assert shared._path_floor(adaptive, 4, 1) > 0.0  # type: ignore[arg-type]
    assert orchestrator()._path_floor(SimpleNamespace(policy=None), 4, 1) == 0.0  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-0.5, 1.5, float("nan")])
def test_the_coordinator_config_refuses_a_floor_outside_zero_one(value: float, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="draft_min_path_confidence"):
        CoordinatorConfig("127.0.0.1:1", ("127.0.0.1:2",), tmp_path, draft_min_path_confidence=value)


def test_the_command_line_takes_auto_or_a_probability() -> None:
    base = ["--draft-addr", "d:1", "--target-addr", "t:1", "--tokenizer", "x"]
    assert parse_config(base)[0].draft_min_path_confidence is None  # auto: the cost model's
    assert parse_config([*base, "--draft-min-path-confidence", "auto"])[0].draft_min_path_confidence is None
    assert parse_config([*base, "--draft-min-path-confidence", "0.25"])[0].draft_min_path_confidence == 0.25
    assert parse_config(base)[0].draft_to_floor
    assert not parse_config([*base, "--no-draft-to-floor"])[0].draft_to_floor
    with pytest.raises(SystemExit):
        parse_config([*base, "--draft-min-path-confidence", "2"])

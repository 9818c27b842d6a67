"""γ for the members of a lockstep round, decided at its start from what each brings (no gRPC, no clocks).

In lockstep (`lockstep.py`) a round's members draft as one batch for as many steps as its longest
proposal needs, then verify as one batch. Wave 6 capped every adaptive member at the lower median wish
of the members that draft, so one member asking for 10 did not hold the rest. Each member still chose
alone, pricing the whole group's draft phase and widened verify against its own acceptance: at
concurrency 8 on the bf16 CPU (wave 29) rows whose drafts passed 70-80 % of the time sat most rounds at
γ = 0 and waited out the 2-3 draft steps that a few code rows ran, and early stops cut proposals short
in a phase that ran on anyway. Every member drafting a fixed γ = 2 ran 1.17× (`sd`) and 1.25× (`csd`)
`ar`, against 1.11× for adaptive γ (32-request levels, alternating in one stack).

`shared_phase` therefore gives every adaptive member the phase's length: once the group drafts, a row
that joins costs one more row of each batched draft step and its verified tokens, not a step of its own.
The phase is as long as wave 6's cap over the adaptive members (their drafting wishes' lower median), so no
adaptive row drafts unless one of them judged drafting to pay (coordinator `--lockstep-phase shared`; `median_cap`,
wave 6's rule, is `--lockstep-phase median`).

`group_phase` (the default since wave 38; wave 37's opt-in `--group-phase`) plans the round for the group: one phase
length L for the members that draft, the others sitting it out, no early stops while several draft (a lone drafter
stops as it would alone). It picks L and how many members draft it (the best acceptance first: for each L the best
number of them) whose round emits the most expected tokens per millisecond over all members, priced by the cost
model: each draft step at the rows still drafting, one verify of every row's tokens. A member's drafts are priced as
independent at its first position's acceptance: the per-position estimates, learned from proposals that the path
floor stopped where the draft was unsure, made long phases look better than they were (a version priced by them
drafted 5 a row at 64-69 % acceptance). On the AMX CPU of wave 37 at concurrency 8 (a scratch A/B,
docs/performance.md "An AMX CPU"): `csd` +22 % / +31 % over wave 6's rule, `sd` −3 % / +4 %; through `bench compare`
(wave 38, docs/performance.md "Concurrency 8: the group phase by default") `csd` ahead of it in 4 of 4 repeat pairs,
`sd` in 3 of 4.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from coordinator.cost_model import MIN_GAIN, CostModel, expected_tokens


class Wish(NamedTuple):
    """What one member brings to a round start."""

    gamma: int  # the γ it chose alone (a fixed γ, or its policy's choice)
    adaptive: bool = False  # its γ is the coordinator's to choose (False: the request fixed it, and only gamma counts)
    limit: int = 0  # adaptive: the most it may draft this round (tokens left, the draft circuit, its draft session)
    floor: int = 0  # adaptive: the least it drafts (a probe: its policy's of acceptance, or the draft circuit's)
    reach: int = 0  # adaptive: how far it drafts alone, its proposal stopping on the path floor (0: its γ)
    alpha: float | None = None  # adaptive, under group_phase: its first draft's acceptance (None: the pair's)
    # its rounds must not hang on timing (a seeded sampling request: its draws follow how its rounds fall; a rescuing
    # one with a fixed γ: only its drafted tokens can be rescued), so it never joins a drafting round with γ 0
    # (Lockstep.start_round)
    reproducible: bool = False

    @classmethod
    def fixed(cls, gamma: int, reproducible: bool = False) -> Wish:
        return cls(gamma, False, gamma, gamma, reproducible=reproducible)


def phase_length(wishes: Sequence[Wish]) -> int:
    """Wave 6's cap: the lower median wish of the members that draft (0: none does)."""
    drafting = sorted(w.gamma for w in wishes if w.gamma > 0)
    return drafting[(len(drafting) - 1) // 2] if drafting else 0


def alone(wish: Wish) -> int:
    """A lone member's γ: an adaptive one that drafts at all drafts up to its reach, since no member waits for its
    draft steps (a newcomer joins the round in progress at its verify, as for any round) and its path floor stops the
    proposal where the draft is unsure (its γ alone prices blind drafts: wave 33, docs/performance.md "A lone
    proposal drafts to its floor")."""
    return max(wish.gamma, min(wish.reach, wish.limit)) if wish.adaptive and wish.gamma > 0 else wish.gamma


def median_cap(wishes: Sequence[Wish]) -> list[int]:
    """Wave 6's rule: each member's own choice, the adaptive ones capped at the phase length."""
    if len(wishes) == 1:
        return [alone(wishes[0])]
    cap = phase_length(wishes)
    return [min(w.gamma, cap) if w.adaptive else w.gamma for w in wishes]


def shared_phase(wishes: Sequence[Wish]) -> list[int]:
    """Every adaptive member drafts the phase's length (within its own bounds); fixed members their γ. The
    length comes from the adaptive members' wishes alone: a request that fixed γ (a seeded one gets 6) drafts
    what it asked, and must not draw rows whose own cost model said no into drafting that far."""
    if len(wishes) == 1:
        return [alone(wishes[0])]
    cap = phase_length([w for w in wishes if w.adaptive])
    return [max(min(cap, w.limit), w.floor) if w.adaptive else w.gamma for w in wishes]


def group_phase(costs: CostModel, wishes: Sequence[Wish]) -> list[int]:
    """One phase length L for the k adaptive members with the best acceptance (the rest sit out at their floor), at
    the (L, k) with the most expected tokens per ms over all members (`_Tally.rate`); a plain round for the adaptive
    members unless drafting beats it by `MIN_GAIN`, as alone. Fixed members draft their γ; a member never drafts
    past its limit nor below its floor. Alone: `alone`, as the other rules.

    Each candidate (L, k) is the one before with one more member raised to L, so its rate is kept up to date by
    that member's change (`_Tally`) instead of summed again over all members: ~γ_max × members candidates a round
    start, under the lockstep's lock (wave 38: the default rule)."""
    if len(wishes) == 1:
        return [alone(wishes[0])]
    step_ms = [costs.draft_ms(1, rows) for rows in range(len(wishes) + 1)]  # a draft step by rows in it, priced once
    alphas = [_alpha(costs, w) for w in wishes]
    plain = [w.floor if w.adaptive else w.gamma for w in wishes]
    ranked = sorted((i for i, w in enumerate(wishes) if w.adaptive), key=lambda i: -alphas[i])
    most = max((wishes[i].limit for i in ranked), default=0)
    start = _Tally.of(plain, alphas, most)
    best, best_rate = plain, start.rate(costs, step_ms, len(plain)) * MIN_GAIN
    for length in range(1, most + 1):
        plan, tally = list(plain), start.copy()
        for i in ranked:  # the k best drafting L, for k = 1, 2, ...
            plan[i] = max(min(length, wishes[i].limit), wishes[i].floor)
            tally.raise_member(plain[i], plan[i], alphas[i])
            if (rate := tally.rate(costs, step_ms, len(plan))) > best_rate:
                best, best_rate = list(plan), rate
    return best


class _Tally:
    """A plan's sums, updated member by member: expected tokens Σ_m E(plan[m], α_m), tokens verified Σ_m (plan[m] + 1),
    and how many members draft at least k (`rows_at[k]`, k ≥ 1; index 0 unused)."""

    def __init__(self, tokens: float, verified: int, rows_at: list[int]) -> None:
        self.tokens, self.verified, self.rows_at = tokens, verified, rows_at

    @classmethod
    def of(cls, plan: Sequence[int], alphas: Sequence[float], most: int) -> _Tally:
        rows_at = [sum(1 for g in plan if g >= k) for k in range(max([most, *plan]) + 1)]
        tokens = sum(expected_tokens(g, a) for g, a in zip(plan, alphas, strict=True))
        return cls(tokens, sum(g + 1 for g in plan), rows_at)

    def copy(self) -> _Tally:
        return _Tally(self.tokens, self.verified, list(self.rows_at))

    def raise_member(self, old: int, new: int, alpha: float) -> None:
        """One member's γ from `old` to `new` (never lower: a plan raises members from their floor)."""
        self.tokens += expected_tokens(new, alpha) - expected_tokens(old, alpha)
        self.verified += new - old
        for k in range(old + 1, new + 1):
            self.rows_at[k] += 1

    def rate(self, costs: CostModel, step_ms: Sequence[float], members: int) -> float:
        """Expected tokens per ms of the lockstep round these sums describe: the tokens over Σ_k draft(rows drafting
        ≥ k) + the Propose call (if anyone drafts) + target(tokens verified, over all rows) + overhead (`step_ms[r]`:
        a draft step of r rows, CostModel.round_ms's price of one)."""
        drafting = sum(step_ms[rows] for rows in self.rows_at[1:] if rows)  # the steps some member still drafts
        call = costs.draft_call_ms if len(self.rows_at) > 1 and self.rows_at[1] else 0.0  # anyone drafts
        verify = costs.target_ms(self.verified, members)
        return self.tokens / (drafting + call + verify + costs.overhead_ms)


def _alpha(costs: CostModel, wish: Wish) -> float:
    return costs.acceptance if wish.alpha is None else wish.alpha

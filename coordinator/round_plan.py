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
adaptive row drafts unless one of them judged drafting to pay. `median_cap` is wave 6's rule, still the
default: `bench compare` at concurrency 8 has not confirmed the scratch A/B yet (coordinator `--shared-phase`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class Wish(NamedTuple):
    """What one member brings to a round start."""

    gamma: int  # the γ it chose alone (a fixed γ, or its policy's choice)
    adaptive: bool = False  # its γ is the coordinator's to choose (False: the request fixed it, and only gamma counts)
    limit: int = 0  # adaptive: the most it may draft this round (tokens left, the draft circuit, its draft session)
    floor: int = 0  # adaptive: the least it drafts (its policy's acceptance probe)
    reach: int = 0  # adaptive: how far it drafts alone, its proposal stopping on the path floor (0: its γ)

    @classmethod
    def fixed(cls, gamma: int) -> Wish:
        return cls(gamma, False, gamma, gamma)


def phase_length(wishes: Sequence[Wish]) -> int:
    """Wave 6's cap: the lower median wish of the members that draft (0: none does)."""
    drafting = sorted(w.gamma for w in wishes if w.gamma > 0)
    return drafting[(len(drafting) - 1) // 2] if drafting else 0


def alone(wish: Wish) -> int:
    """A lone member's γ: an adaptive one that drafts at all drafts up to its reach, since no member waits for its
    draft steps (a newcomer waits for the round in progress, as for any round) and its path floor stops the
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

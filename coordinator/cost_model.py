"""Whether speculation pays, and how far to speculate: γ per round from costs and acceptance.

A round with γ draft tokens costs `draft(γ) + target(γ+1) + overhead` and emits, if every
draft token is accepted independently with probability α, `(1 − α^(γ+1)) / (1 − α)` tokens
(Leviathan et al. 2023). γ = 0 is a plain target step: one token for `target(1)`. The policy
picks the γ with the most expected tokens per millisecond, so it drafts nothing where the
(γ+1)-token target forward is too dear next to a one-token one (float32 on CPUs without bf16
units) and drafts far where verification is nearly free (GPUs, AMX).

Costs start from what the services measured at start-up (`ModelInfo.forward_costs`) and are
corrected online from every round's measured service times (an exponential moving average of
observed / predicted), so the curve's level follows load and noise while its shape stays the
measured one. Acceptance is per request (it depends on the text), shrunk towards the pair-wide
running acceptance while a request has seen few tokens. No gRPC here; no clocks either.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from dataclasses import dataclass, field

# Used when a service reports no start-up costs: GPU-like (verification ~flat), a draft step a
# fifth of a target step. The online correction then fixes the level, not the shape.
FALLBACK_TARGET_MS = {1: 1.0, 17: 1.5}
FALLBACK_DRAFT_MS = {1: 0.2}
PRIOR_ACCEPTANCE = 0.6
PRIOR_WEIGHT = 4.0  # pseudo-trials of the pair-wide acceptance in each request's estimate
ACCEPTANCE_DECAY = 0.9  # per round: a request's acceptance follows its text
COST_EMA = 0.2
MIN_GAIN = 1.03  # speculate only when the model predicts at least 3% more tokens/ms than a plain step
PROBE_EVERY = 8  # target-only rounds between probes, where a better acceptance could make drafting pay
PROBE_ALPHA = 0.9


@dataclass(frozen=True)
class CostCurve:
    """Milliseconds of one forward by number of new tokens, linearly interpolated between points."""

    points: tuple[tuple[int, float], ...]  # sorted by new tokens, at least one

    @classmethod
    def of(cls, points: dict[int, float]) -> CostCurve:
        if not points:
            raise ValueError("a cost curve needs at least one point")
        return cls(tuple(sorted(points.items())))

    def at(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        xs = [x for x, _ in self.points]
        i = bisect_left(xs, tokens)
        if i < len(xs) and xs[i] == tokens:
            return self.points[i][1]
        if len(self.points) == 1:  # one point: per-token cost, linear through zero
            x, y = self.points[0]
            return y * tokens / x
        lo, hi = (i - 1, i) if 0 < i < len(xs) else ((0, 1) if i == 0 else (len(xs) - 2, len(xs) - 1))
        (x0, y0), (x1, y1) = self.points[lo], self.points[hi]
        return max(y0 + (y1 - y0) * (tokens - x0) / (x1 - x0), 1e-6)


def expected_tokens(gamma: int, alpha: float) -> float:
    """Tokens one round emits with γ drafts each accepted with probability α (bonus/correction included)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


@dataclass
class _Scale:
    """observed / predicted, as an exponential moving average (1.0 until observed)."""

    value: float = 1.0
    seen: bool = False

    def observe(self, ratio: float) -> None:
        self.value = ratio if not self.seen else (1 - COST_EMA) * self.value + COST_EMA * ratio
        self.seen = True


class CostModel:
    """The pair's forward costs (shared by all requests; thread-safe) and the γ policy."""

    def __init__(self, target: CostCurve, draft: CostCurve, draft_call_ms: float = 0.5) -> None:
        self.target = target
        self.draft = draft
        self._target_scale = _Scale()
        self._draft_scale = _Scale()
        self.draft_call_ms = draft_call_ms  # per-round cost of the Propose round trip (RPC, (de)serialising)
        self.overhead_ms = 0.5  # per-round cost outside the services' handlers
        self.acceptance = PRIOR_ACCEPTANCE  # pair-wide running acceptance: each request's prior
        self._lock = threading.Lock()

    @classmethod
    def from_measured(cls, target: dict[int, float], draft: dict[int, float]) -> CostModel:
        return cls(CostCurve.of(target or FALLBACK_TARGET_MS), CostCurve.of(draft or FALLBACK_DRAFT_MS))

    def target_ms(self, tokens: int) -> float:
        return self.target.at(tokens) * self._target_scale.value

    def draft_ms(self, tokens: int) -> float:
        return self.draft.at(tokens) * self._draft_scale.value

    def round_ms(self, gamma: int) -> float:
        drafting = self.draft_ms(gamma) + self.draft_call_ms if gamma > 0 else 0.0
        return drafting + self.target_ms(gamma + 1) + self.overhead_ms

    def rate(self, gamma: int, alpha: float) -> float:
        """Expected tokens per millisecond of rounds with γ drafts."""
        return expected_tokens(gamma, alpha) / self.round_ms(gamma)

    def best_gamma(self, alpha: float, max_gamma: int) -> int:
        """The γ in [0, max_gamma] with the best expected rate; 0 unless drafting beats a plain step by MIN_GAIN."""
        plain = self.rate(0, alpha)
        best, best_rate = 0, plain * MIN_GAIN
        for gamma in range(1, max_gamma + 1):
            rate = self.rate(gamma, alpha)
            if rate > best_rate:
                best, best_rate = gamma, rate
        return best

    # --- online corrections -----------------------------------------------------------------

    def observe_target(self, tokens: int, ms: float) -> None:
        with self._lock:
            self._target_scale.observe(ms / self.target.at(tokens))

    def observe_draft(self, tokens: int, service_ms: float, call_ms: float) -> None:
        """A Propose of `tokens` took service_ms inside the draft and call_ms at the caller."""
        with self._lock:
            self._draft_scale.observe(service_ms / self.draft.at(tokens))
            self.draft_call_ms = (1 - COST_EMA) * self.draft_call_ms + COST_EMA * max(call_ms - service_ms, 0.0)

    def observe_overhead(self, ms: float) -> None:
        with self._lock:
            self.overhead_ms = (1 - COST_EMA) * self.overhead_ms + COST_EMA * max(ms, 0.0)

    def observe_acceptance(self, alpha: float) -> None:
        """A finished request's acceptance moves the pair-wide prior."""
        with self._lock:
            self.acceptance = (1 - COST_EMA) * self.acceptance + COST_EMA * alpha


@dataclass
class AcceptanceTracker:
    """One request's acceptance α: accepted drafts over draft positions examined, recent rounds weighted more.

    A round that drafts k and accepts a examined a positions that passed and, if a < k, one that failed.
    """

    prior: float
    accepted: float = 0.0
    examined: float = 0.0

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        self.accepted = ACCEPTANCE_DECAY * self.accepted + accepted
        self.examined = ACCEPTANCE_DECAY * self.examined + accepted + (1 if accepted < drafted else 0)

    @property
    def alpha(self) -> float:
        return (self.accepted + PRIOR_WEIGHT * self.prior) / (self.examined + PRIOR_WEIGHT)


@dataclass
class GammaPolicy:
    """Per request: γ for the next round from the shared cost model and the request's acceptance."""

    costs: CostModel
    max_gamma: int
    tracker: AcceptanceTracker = field(init=False)
    _plain_streak: int = 0

    def __post_init__(self) -> None:
        self.tracker = AcceptanceTracker(self.costs.acceptance)

    def next_gamma(self) -> int:
        gamma = self.costs.best_gamma(self.tracker.alpha, self.max_gamma)
        if gamma > 0:
            self._plain_streak = 0
            return gamma
        self._plain_streak += 1
        if self._plain_streak > PROBE_EVERY:  # re-measure acceptance where it could change the answer
            probe = self.costs.best_gamma(PROBE_ALPHA, self.max_gamma)
            if probe > 0:
                self._plain_streak = 0
                return min(probe, 2)
        return 0

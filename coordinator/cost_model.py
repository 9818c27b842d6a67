"""Whether speculation pays, and how far to speculate: γ per round from costs and acceptance.

A round with γ draft tokens costs `γ · draft(B) + target(B·(γ+1)) + overhead` (the draft proposes one
token per forward; the target verifies γ + 1 in one) when B sessions share each batched forward:
a batch of B rows of n new tokens costs about one forward of B·n tokens (the weights are read once
either way and the matmuls see B·n rows), so the same measured curve prices both, and on hardware
where the forward turns compute-bound (CPUs) a loaded service drafts shorter. B is a running average
of the batch sizes the target reports; each size class of batch learns its own correction of that
curve (`CurvesByRows`: every row adds work of its own). The round emits, if every
draft token is accepted independently with probability α, `(1 − α^(γ+1)) / (1 − α)` tokens
(Leviathan et al. 2023). γ = 0 is a plain target step: one token for `target(1)`. The policy
picks the γ with the most expected tokens per millisecond, so it drafts nothing where the
(γ+1)-token target forward is too dear next to a one-token one (float32 on CPUs without bf16
units) and drafts far where verification is nearly free (GPUs, AMX).

Costs start from what the services measured at start-up (`ModelInfo.forward_costs`) and are
corrected online from every round's measured times (`LearnedCurve`): a level that every observation
moves (load, the host's drift) and, per measured point, a shape factor that the observations near it
move by what the level leaves unexplained, so a start-up point that timed badly stops steering γ once
rounds have measured it. Acceptance is per request (it depends on the text), shrunk towards the
pair-wide running acceptance while a request has seen few tokens. No gRPC here; no clocks either.
"""

from __future__ import annotations

import copy
import math
import threading
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

# Used when a service reports no start-up costs: GPU-like (verification ~flat), a draft step a
# fifth of a target step. The online correction then fixes the level, not the shape.
FALLBACK_TARGET_MS = {1: 1.0, 17: 1.5}
FALLBACK_DRAFT_MS = {1: 0.2}
PRIOR_ACCEPTANCE = 0.6
PRIOR_WEIGHT = 4.0  # pseudo-trials of the pair-wide acceptance in each request's estimate
ACCEPTANCE_DECAY = 0.9  # per round: a request's acceptance follows its text
COST_EMA = 0.2
SHAPE_EMA = 0.2  # per observation at a point (weighted by closeness), of the residual the level leaves
SHAPE_BOUNDS = (0.25, 4.0)  # how far rounds may bend a start-up point (a guard against outliers)
MIN_GAIN = 1.03  # speculate only when the model predicts at least 3% more tokens/ms than a plain step
PROBE_EVERY = 8  # target-only rounds between probes, where a better acceptance could make drafting pay
MAX_PROBE_INTERVAL = 32  # fruitless probes back off (doubling) up to this many target-only rounds
PROBE_ALPHA = 0.9
MAX_PATH_FLOOR = 0.9  # a derived path floor never exceeds this: a sure enough first token still drafts on
# A lone proposal drafts past its γ as far as its further drafts cost on average at most this many times the draft
# that priced its path floor (past that the floor is too cheap: a verify forward whose cost bends up with its tokens)
REACH_SLACK = 1.5


@dataclass(frozen=True)
class CostCurve:
    """Milliseconds of one forward by number of new tokens, linearly interpolated between points.

    Never decreasing in tokens: a forward of more tokens costs at least what a shorter one does, so
    `of` raises each point to the largest before it (start-up timings are noisy; a dip must not
    extrapolate into costs near zero)."""

    xs: tuple[int, ...]  # new tokens, sorted, at least one
    ys: tuple[float, ...]  # ms, non-decreasing

    @classmethod
    def of(cls, points: dict[int, float]) -> CostCurve:
        if not points:
            raise ValueError("a cost curve needs at least one point")
        xs, ys = zip(*sorted(points.items()), strict=True)
        return cls(xs, tuple(accumulate(ys, max)))

    def at(self, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        xs, ys = self.xs, self.ys
        i = bisect_left(xs, tokens)
        if i < len(xs) and xs[i] == tokens:
            return ys[i]
        if len(xs) == 1:  # one point: per-token cost, linear through zero
            return ys[0] * tokens / xs[0]
        lo, hi = (i - 1, i) if 0 < i < len(xs) else ((0, 1) if i == 0 else (len(xs) - 2, len(xs) - 1))
        return max(ys[lo] + (ys[hi] - ys[lo]) * (tokens - xs[lo]) / (xs[hi] - xs[lo]), 1e-6)


def expected_tokens(gamma: int, alpha: float) -> float:
    """Tokens one round emits with γ drafts each accepted with probability α (bonus/correction included)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def expected_tokens_by_position(alphas: Sequence[float]) -> float:
    """Tokens one round emits when draft k passes with probability alphas[k] given that all before it
    passed: 1 + Σ_j Π_{k<=j} α_k. Acceptance is bursty (a draft that got the last token right
    tends to get the next one too), so a single α undercounts what long proposals emit."""
    total, reach = 1.0, 1.0
    for alpha in alphas:
        reach *= alpha
        total += reach
    return total


@dataclass
class _Scale:
    """observed / predicted, as an exponential moving average (1.0 until observed)."""

    value: float = 1.0
    seen: bool = False

    def observe(self, ratio: float) -> None:
        self.value = ratio if not self.seen else (1 - COST_EMA) * self.value + COST_EMA * ratio
        self.seen = True


class LearnedCurve:
    """A start-up `CostCurve` corrected by what rounds measure (not thread-safe: `CostModel` locks).

    The level (observed / predicted, an exponential moving average) follows every observation. Each
    point past the first also has a shape factor, moved by the observations between it and its
    neighbours (in proportion to how close they fall) by what the level leaves unexplained. The first
    point anchors the shape: with observations at one count only, the level follows them and the
    shape stays the measured one. Why: start-up timings can be off by a third for one count while
    rounds measure it every time (the AVX2 EPYC's float32 target: 2 new tokens at 1.38-1.56x one token
    in three start-ups, 1.13-1.26x in rounds and in `bench forward`), and γ = 1 or 2 lives on that
    point; a level alone never fixes a shape."""

    def __init__(self, measured: CostCurve) -> None:
        self.measured = measured
        self.level = _Scale()
        self.shape = [1.0] * len(measured.xs)
        self.curve = measured  # measured × shape, non-decreasing

    def at(self, x: float) -> float:
        return self.curve.at(x) * self.level.value

    def observe(self, x: float, ms: float) -> None:
        """One forward of `x` (new tokens, or rows for a draft step) took `ms`."""
        predicted = self.curve.at(x)
        if self.level.seen:  # what the level does not explain bends the points around x
            residual = ms / (predicted * self.level.value) - 1.0
            for i, weight in self._neighbours(x):
                if i > 0:
                    bent = self.shape[i] * (1.0 + SHAPE_EMA * weight * residual)
                    self.shape[i] = min(max(bent, SHAPE_BOUNDS[0]), SHAPE_BOUNDS[1])
            points = zip(self.measured.xs, self.measured.ys, self.shape, strict=True)
            self.curve = CostCurve.of({x_i: y * s for x_i, y, s in points})
        self.level.observe(ms / predicted)

    def _neighbours(self, x: float) -> list[tuple[int, float]]:
        """The measured points x falls between, each with its interpolation weight."""
        xs = self.measured.xs
        i = bisect_left(xs, x)
        if i == len(xs):
            return [(len(xs) - 1, 1.0)]  # beyond the last point: it alone extrapolates there
        if xs[i] == x or i == 0:
            return [(i, 1.0)]
        upper = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return [(i - 1, 1.0 - upper), (i, upper)]


class CurvesByRows:
    """The target's forward cost by new tokens over all its rows, learned apart for each size class of batch
    (1 row, 2, 3-4, 5-8, 9-16, ...).

    Tokens over all rows price a batch to first order (the weights are read once, the matmuls see every row),
    but each row adds work of its own (its attention over its own cache, its cache writes, its padding): on the
    bf16 EPYC 8 rows of 1 token cost 158 ms (wave 30), one row of 8 tokens ~140 (wave 33). With one curve, a lone
    request's 10-11-token verifies and an 8-row round's ~11 tokens taught the same point (a suspect in wave 33's
    concurrency-8 A/B, whose coordinators, with and without `--draft-to-floor`, chose a mean γ of 1.13 and 0.47;
    not shown to be the cause). A class's first forward starts it as a copy of the nearest class already measured
    (the larger on a tie: the dearer per row), or of the start-up curve; until then that class prices it.

    Read without `CostModel`'s lock: `observe` (under it) never changes a dict a reader may be iterating, it swaps
    in a new one."""

    def __init__(self, measured: CostCurve) -> None:
        self.by_class: dict[int, LearnedCurve] = {0: LearnedCurve(measured)}  # class 0 unseen until a lone forward

    @staticmethod
    def size_class(rows: float) -> int:
        """0 for one row, 1 for 2, 2 for 3-4, 3 for 5-8, ...: a running average of rows rounds half up to its class."""
        return (max(math.floor(rows + 0.5), 1) - 1).bit_length()

    def of(self, rows: float) -> LearnedCurve:
        """The curve that prices a forward of `rows` rows: its class's, else the nearest measured class's, else the
        start-up curve (class 0 before any forward)."""
        classes, wanted = self.by_class, self.size_class(rows)
        curve = classes.get(wanted)  # measured already, once the class has seen a forward: every round prices here
        return curve if curve is not None and curve.level.seen else self._nearest(classes, wanted)

    def at(self, tokens: float, rows: float = 1.0) -> float:
        return self.of(rows).at(tokens)

    def observe(self, tokens: float, ms: float, rows: float = 1) -> None:
        """One forward of `rows` rows and `tokens` new tokens over all of them took `ms` (the caller holds the lock)."""
        size_class, classes = self.size_class(rows), self.by_class
        if size_class not in classes or not classes[size_class].level.seen:  # its first forward
            self.by_class = {**classes, size_class: copy.deepcopy(self._nearest(classes, size_class))}
        self.by_class[size_class].observe(tokens, ms)

    @staticmethod
    def _nearest(classes: dict[int, LearnedCurve], wanted: int) -> LearnedCurve:
        measured = [c for c, curve in classes.items() if curve.level.seen]
        if not measured:
            return classes[0]
        return classes[min(measured, key=lambda c: (abs(c - wanted), -c))]


class CostModel:
    """The pair's forward costs (shared by all requests; thread-safe) and the γ policy."""

    def __init__(self, target: CostCurve, draft: CostCurve, draft_call_ms: float = 0.5) -> None:
        self.target = CurvesByRows(target)  # ms by new tokens over all rows of a verify forward, by batch size
        self.draft = LearnedCurve(draft)  # ms of one draft step by sessions in it
        self.draft_call_ms = draft_call_ms  # per-round cost of the Propose round trip (RPC, (de)serialising)
        self.overhead_ms = 0.5  # per-round cost outside the services' handlers
        self.acceptance = PRIOR_ACCEPTANCE  # pair-wide running acceptance: each request's prior
        self.batch = 1.0  # sessions per batched forward, a running average of what the target reports
        self._lock = threading.Lock()

    @classmethod
    def from_measured(cls, target: dict[int, float], draft: dict[int, float]) -> CostModel:
        return cls(CostCurve.of(target or FALLBACK_TARGET_MS), CostCurve.of(draft or FALLBACK_DRAFT_MS))

    def target_ms(self, tokens: float, rows: float = 1.0) -> float:
        """One target forward of `tokens` new tokens over all its `rows` rows."""
        return self.target.at(tokens, rows)

    def draft_ms(self, tokens: int, batch: float = 1.0) -> float:
        """Drafting `tokens` for each of `batch` sessions: that many batched one-token-per-session forwards."""
        return tokens * self.draft.at(batch)

    def round_ms(self, gamma: int, batch: float = 1.0) -> float:
        drafting = self.draft_ms(gamma, batch) + self.draft_call_ms if gamma > 0 else 0.0
        return drafting + self.target_ms(batch * (gamma + 1), batch) + self.overhead_ms

    def rate(self, gamma: int, alpha: float | Sequence[float], batch: float = 1.0) -> float:
        """Expected tokens per millisecond of one request's rounds with γ drafts (α: one for all
        positions, or per position), `batch` sessions sharing each forward."""
        alphas = [alpha] * gamma if isinstance(alpha, float | int) else alpha[:gamma]
        return expected_tokens_by_position(alphas) / self.round_ms(gamma, batch)

    def best_gamma(self, alpha: float | Sequence[float], max_gamma: int, batch: float | None = None) -> int:
        """The γ in [0, max_gamma] with the best expected rate; 0 unless drafting beats a plain step by MIN_GAIN.
        `alpha`: one acceptance for every position, or one per position (at least max_gamma of them);
        `batch`: sessions per forward (default: the running average of what the target reports)."""
        batch = self.batch if batch is None else batch
        plain = self.rate(0, alpha, batch)
        best, best_rate = 0, plain * MIN_GAIN
        for gamma in range(1, max_gamma + 1):
            rate = self.rate(gamma, alpha, batch)
            if rate > best_rate:
                best, best_rate = gamma, rate
        return best

    def path_confidence_floor(self, gamma: int, alpha: float | Sequence[float], batch: float | None = None) -> float:
        """Where a proposal of up to γ drafts should stop: once the product P of its tokens' draft probabilities
        (the draft's own estimate that every token so far passes) is below this. One more draft token costs
        what a round of one more draft costs (a draft step, a wider verify) and adds P·α expected tokens; it pays
        while that is at least what the round's own rate earns in that time: P ≥ marginal ms · rate / α (α: the
        mean acceptance of the γ positions). 0 for a plain step. docs/performance.md, "Where a proposal stops"."""
        if gamma <= 0:
            return 0.0
        batch = self.batch if batch is None else batch
        alphas = [alpha] * gamma if isinstance(alpha, float | int) else list(alpha[:gamma])
        if len(alphas) < gamma:
            raise ValueError(f"need an acceptance for each of {gamma} positions, got {len(alphas)}")
        mean_alpha = sum(alphas) / gamma
        rate = self.rate(gamma, alphas, batch)
        floor = self.floor_draft_ms(batch) * rate / mean_alpha if mean_alpha > 0 else MAX_PATH_FLOOR
        return min(floor, MAX_PATH_FLOOR) if math.isfinite(floor) else MAX_PATH_FLOOR

    def floor_draft_ms(self, batch: float) -> float:
        """What the path floor prices one more draft at: the second draft's marginal round time (the first always
        runs), a draft step and one more verified position."""
        return self.round_ms(2, batch) - self.round_ms(1, batch)

    def path_reach(self, gamma: int, limit: int, batch: float | None = None) -> int:
        """How far a lone proposal of γ drafts (at most `limit`), its path floor stopping it where the draft is
        unsure: the furthest k whose drafts past γ cost on average at most REACH_SLACK times the second draft, which
        priced the floor (`path_confidence_floor`, at the same batch: default the running average). On average, so
        a step in the verify curve does not stop it short of the cheap positions after it (bf16 oneDNN here: 7 rows
        cost ~1.2x 6, then 2-5 % more a row; wave 33). γ itself for a plain step. docs/performance.md, "A lone
        proposal drafts to its floor"."""
        if gamma <= 0:
            return gamma
        batch = self.batch if batch is None else batch
        priced, base = self.floor_draft_ms(batch), self.round_ms(gamma, batch)
        reach = gamma
        for k in range(gamma + 1, limit + 1):
            if (self.round_ms(k, batch) - base) / (k - gamma) <= REACH_SLACK * priced:
                reach = k
        return reach

    # --- online corrections -----------------------------------------------------------------

    def observe_target(self, tokens: int, ms: float, batch: int = 1, batch_tokens: int = 0) -> None:
        """A Verify of `tokens` new tokens took `ms` in a forward of `batch` rows and `batch_tokens` new
        tokens over all of them (as the target reports; 0: unknown, taken as `batch` rows like this one)."""
        batch = max(batch, 1)
        with self._lock:
            self.batch = (1 - COST_EMA) * self.batch + COST_EMA * batch
            self.target.observe(batch_tokens or batch * tokens, ms, batch)

    def observe_draft(self, tokens: int, forward_ms: float, service_ms: float, call_ms: float) -> None:
        """A Propose of `tokens` spent forward_ms in the draft's forwards (its `tokens` batched steps),
        service_ms inside the draft and call_ms at the caller.

        The per-token cost comes from the forwards alone: in a batch, a proposal that stopped early
        returns when the batch's longest one is done (measured under lockstep at concurrency 8:
        service time per drafted token ran ~9x the forward's, and γ collapsed to 0)."""
        with self._lock:
            spent = forward_ms if forward_ms > 0 else service_ms  # a draft that reports no forward time
            self.draft.observe(self.batch, spent / tokens)
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
    """One request's acceptance, overall and by draft position, recent rounds weighted more.

    A round that drafts k and accepts a examined a positions that passed and, if a < k, the one that
    failed. Position j's estimate is P(draft j passes | drafts before it passed), shrunk towards
    position j − 1's estimate (position 1's towards the overall acceptance) while it has few observations, so a
    position never reached so far inherits the last one's acceptance.
    """

    prior: float
    accepted: float = 0.0
    examined: float = 0.0
    passed_at: list[float] = field(default_factory=list)  # [position]
    examined_at: list[float] = field(default_factory=list)  # [position]

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        failed = 1 if accepted < drafted else 0
        self.accepted = ACCEPTANCE_DECAY * self.accepted + accepted
        self.examined = ACCEPTANCE_DECAY * self.examined + accepted + failed
        grow = accepted + failed - len(self.examined_at)
        self.passed_at += [0.0] * grow
        self.examined_at += [0.0] * grow
        for k in range(len(self.examined_at)):
            self.passed_at[k] = ACCEPTANCE_DECAY * self.passed_at[k] + (k < accepted)
            self.examined_at[k] = ACCEPTANCE_DECAY * self.examined_at[k] + (k < accepted + failed)

    @property
    def alpha(self) -> float:
        return (self.accepted + PRIOR_WEIGHT * self.prior) / (self.examined + PRIOR_WEIGHT)

    def alphas(self, positions: int) -> list[float]:
        """Acceptance at draft positions 1..`positions`, each given that the ones before it passed."""
        out, previous = [], self.alpha
        for k in range(positions):
            passed, examined = (self.passed_at[k], self.examined_at[k]) if k < len(self.examined_at) else (0.0, 0.0)
            previous = (passed + PRIOR_WEIGHT * previous) / (examined + PRIOR_WEIGHT)
            out.append(previous)
        return out


@dataclass
class GammaPolicy:
    """Per request: γ for the next round from the shared cost model and the request's acceptance."""

    costs: CostModel
    max_gamma: int
    tracker: AcceptanceTracker = field(init=False)
    _plain_streak: int = 0
    _probing: bool = False  # the last γ chosen was a probe
    _fruitless: int = 0  # failed probes since drafting last paid or a probe kept every draft

    def __post_init__(self) -> None:
        self.tracker = AcceptanceTracker(self.costs.acceptance)

    def next_gamma(self) -> int:
        gamma = self.costs.best_gamma(self.tracker.alphas(self.max_gamma), self.max_gamma)
        self._probing = False
        if gamma > 0:
            self._plain_streak = self._fruitless = 0
            return gamma
        self._plain_streak += 1
        if self._plain_streak > self._probe_interval():  # re-measure acceptance where it could change the answer
            probe = self.costs.best_gamma(PROBE_ALPHA, self.max_gamma)
            if probe > 0:
                self._plain_streak, self._probing = 0, True
                return min(probe, 2)
        return 0

    @property
    def probing(self) -> bool:
        """The last γ chosen re-measures acceptance (a shared draft phase keeps at least its γ)."""
        return self._probing

    def observe(self, drafted: int, accepted: int) -> None:
        """The round's outcome: `drafted` may differ from the γ chosen (the lockstep round, an early stop)."""
        self.tracker.observe(drafted, accepted)
        if drafted and not self._probing:  # a round that drafted (a shared phase) measured acceptance
            self._plain_streak = 0
        if self._probing and drafted:  # a failed probe backs off; one that kept every draft starts over
            self._fruitless = self._fruitless + 1 if accepted < drafted else 0

    def _probe_interval(self) -> int:
        """Target-only rounds before a probe: PROBE_EVERY once the request's acceptance rests on as many
        examined drafts, sooner while it rests on fewer. A plain round teaches nothing about acceptance,
        and one failed first round (0 of 3 kept: α 0.56 -> 0.45) used to hold code prompts whose drafts
        later passed 85 % of the time at γ = 0 for 8 rounds, twice (the AVX2 EPYC, 16 of ~34 rounds).

        Each failed probe that left drafting unpaid doubles the interval, up to MAX_PROBE_INTERVAL, until a
        round drafts on its own merit or a probe keeps every draft (then it starts over): on
        text the draft cannot follow (prose on the coder pair) a probe costs its draft forwards and a
        wider verify for about one token, and probing every 8 rounds cost that prompt 5-10 % against
        `ar` (wave 16: 12 of 65 rounds, 0.90-0.95x). Text that turns draftable waits at most 32 rounds for
        its first probe."""
        evidence = min(PROBE_EVERY, 1 + int(self.tracker.examined))
        return min(MAX_PROBE_INTERVAL, evidence << self._fruitless)

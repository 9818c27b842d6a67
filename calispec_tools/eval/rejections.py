"""Rejection analysis from the correction memory's pair counts. Pure: the counts come from the runner.

The coverage curve answers the paper's question "how skewed are rejections?": the share of all
rejection events held by the x% most frequent (draft, target) pairs (paper: top 20% → ~69%).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# What the paper also shows, the per-event target probability ratio p(x̃)/p(t*), never leaves the verifier
# (RecordEvents carries counts only); `calispec eval --ratio-analysis` measures it offline (eval/ratios.py).
PROBABILITY_RATIO_NOTE = (
    "not measured: the services export counts only; run `calispec eval --ratio-analysis` for the offline, "
    "in-process analysis of p(draft)/p(target) per pair"
)


def coverage_curve(counts: Sequence[int], points: int = 100) -> list[tuple[float, float]]:
    """[(share of pairs, share of events covered by the most frequent pairs)], x from 1/points to 1."""
    ordered = sorted((c for c in counts if c > 0), reverse=True)
    total = sum(ordered)
    if not total:
        return []
    prefix = [0]
    for c in ordered:
        prefix.append(prefix[-1] + c)
    curve = []
    for i in range(1, points + 1):
        x = i / points
        top = math.ceil(x * len(ordered) - 1e-9)
        curve.append((x, prefix[top] / total))
    return curve


def share_at(curve: Sequence[tuple[float, float]], x: float) -> float:
    """Covered share at pair share x (the first curve point at or beyond x)."""
    for px, py in curve:
        if px >= x - 1e-12:
            return py
    return math.nan


def gained(before: Sequence[tuple[int, int, int]], after: Sequence[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The pairs' counts a run added to a table: after less before, per pair (a pair evicted or decayed meanwhile
    counts what it gained, at least nothing; both reads are GetPairs', capped at the service's default number of
    pairs, the table's default cap too)."""
    had = {(draft, target): count for draft, target, count in before}
    return [(d, t, c - had.get((d, t), 0)) for d, t, c in after if c > had.get((d, t), 0)]


def table_summary(pairs: Sequence[tuple[int, int, int]]) -> dict[str, Any]:
    """A whole table's size and concentration (the run's analysis is `analyse`)."""
    whole = analyse(pairs)
    return {key: whole[key] for key in ("distinct_pairs", "events", "top20_share")}


def analyse(pairs: Sequence[tuple[int, int, int]], decode: Any = None, top: int = 20) -> dict[str, Any]:
    """pairs: (draft_token_id, target_token_id, count). `decode(token_id) -> str` labels the top pairs."""
    ordered = sorted(pairs, key=lambda p: p[2], reverse=True)
    curve = coverage_curve([c for _, _, c in ordered])
    total = sum(c for _, _, c in ordered)

    def row(p: tuple[int, int, int]) -> dict[str, Any]:
        out: dict[str, Any] = {"draft_token_id": p[0], "target_token_id": p[1], "count": p[2]}
        if decode is not None:
            out["draft_text"], out["target_text"] = decode(p[0]), decode(p[1])
        return out

    return {
        "distinct_pairs": len(ordered),
        "events": total,
        "top20_share": share_at(curve, 0.2) if curve else math.nan,
        "coverage_curve": [{"pair_share": x, "event_share": y} for x, y in curve],
        "top_pairs": [row(p) for p in ordered[:top]],
        "probability_ratio": PROBABILITY_RATIO_NOTE,
    }

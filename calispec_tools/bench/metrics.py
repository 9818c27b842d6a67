"""From per-request records to the figures of a report. Pure: no gRPC, no clock.

Definitions (also written into the JSON so a reader need not find this file):
- TTFT: request sent → first streamed chunk. A chunk is one propose/verify round, so it can
  carry several tokens; ITL is the gap between consecutive chunks, TPOT = (e2e − TTFT) /
  (output tokens − 1).
- Modes share one window when interleaved, so a mode's throughput is computed over its share
  of the window: window × (its summed request time / everyone's summed request time). With a
  single mode this is plainly completed requests / window.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

DEFINITIONS = {
    "ttft": "seconds from sending the request to the first streamed chunk",
    "itl": "seconds between consecutive streamed chunks (one chunk = one round, possibly several tokens)",
    "tpot": "(e2e - ttft) / (output_tokens - 1), per request with > 1 output token",
    "e2e": "seconds from sending the request to its last chunk",
    "request_throughput_rps": "ok requests / the mode's share of the window (share = its summed e2e / all summed e2e)",
    "output_tokens_per_s": "output tokens / the mode's share of the window",
    "acceptance_rate": "sum accepted (incl. rescued) / sum drafted",
    "mean_accepted_per_round": "sum accepted / sum rounds (draft tokens kept per target forward)",
    "tokens_per_round": "sum emitted / sum rounds (accepted + the target's own token)",
    "rescue_rate": "sum rescued / sum rejection events (share of rejections that CSD rescued)",
    "time_shares": "sum of each stats *_ms / sum total_ms",
    "acceptance_by_position": "k -> P(draft token k accepted | round drafted >= k), from streamed rounds "
    "(every chunk but the last, which may be clipped); gamma per round = min(gamma, remaining - 1)",
}
PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """One request as the client saw it; times in seconds."""

    slot: int
    mode: str
    prompt_index: int
    max_new_tokens: int
    gamma: int
    start_s: float = 0.0  # offset from the start of the measured window
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunk_offsets_s: list[float] = field(default_factory=list)  # each chunk's arrival, from request start
    chunk_tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stats: dict[str, float] | None = None
    error: str | None = None  # gRPC status name, or CLIENT_<ExceptionType>

    @property
    def ok(self) -> bool:
        return self.error is None and self.e2e_s is not None

    @property
    def output_tokens(self) -> int:
        return sum(self.chunk_tokens)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def distribution(values: Sequence[float]) -> dict[str, float]:
    out = {"n": float(len(values)), "mean": sum(values) / len(values) if values else math.nan}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(values, q)
    return out


def tpot(record: RequestRecord) -> float | None:
    if not record.ok or record.ttft_s is None or record.output_tokens < 2:
        return None
    assert record.e2e_s is not None
    return (record.e2e_s - record.ttft_s) / (record.output_tokens - 1)


def inter_chunk_gaps(record: RequestRecord) -> list[float]:
    t = record.chunk_offsets_s
    return [b - a for a, b in itertools.pairwise(t)]


def round_acceptance(record: RequestRecord) -> list[tuple[int, int]]:
    """(drafted, accepted) per round, derived from the stream: a full round emits accepted + 1 tokens.

    The last chunk is skipped (EOS or the token limit may clip it); so are rounds of `ar`.
    """
    if record.gamma <= 0:
        return []
    rounds: list[tuple[int, int]] = []
    generated = 0
    for tokens in record.chunk_tokens[:-1]:
        drafted = min(record.gamma, record.max_new_tokens - generated - 1)  # the coordinator's clip
        if drafted > 0:
            rounds.append((drafted, min(tokens - 1, drafted)))
        generated += tokens
    return rounds


def acceptance_by_position(records: Iterable[RequestRecord]) -> dict[int, float]:
    reached: Counter[int] = Counter()
    kept: Counter[int] = Counter()
    for record in records:
        for drafted, accepted in round_acceptance(record):
            for k in range(1, drafted + 1):
                reached[k] += 1
                kept[k] += k <= accepted
    return {k: kept[k] / reached[k] for k in sorted(reached)}


def _ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


def speculation_figures(stats: Sequence[dict[str, float]]) -> dict[str, Any]:
    total = {key: sum(s.get(key, 0.0) for s in stats) for key in stats[0]} if stats else {}
    get = total.get
    return {
        "acceptance_rate": _ratio(get("accepted", 0), get("drafted", 0)),
        "mean_accepted_per_round": _ratio(get("accepted", 0), get("rounds", 0)),
        "tokens_per_round": _ratio(get("emitted", 0), get("rounds", 0)),
        "rescue_rate": _ratio(get("rescued", 0), get("rejections", 0)),
        "totals": total,
        "time_shares": {
            part: _ratio(get(f"{part}_ms", 0), get("total_ms", 0))
            for part in ("draft", "target", "memory", "coordinator")
        },
    }


def summarize_mode(records: Sequence[RequestRecord], window_s: float, busy_all_s: float) -> dict[str, Any]:
    """Figures of one mode's records; window_s and busy_all_s (all modes' summed e2e) set its window share."""
    ok = [r for r in records if r.ok]
    busy = sum(r.e2e_s or 0.0 for r in ok)
    share_s = window_s * _ratio(busy, busy_all_s) if busy_all_s else math.nan
    tokens = sum(r.output_tokens for r in ok)
    return {
        "requests": len(records),
        "ok": len(ok),
        "errors": dict(Counter(r.error for r in records if r.error)),
        "output_tokens": tokens,
        "window_share_s": share_s,
        "request_throughput_rps": _ratio(len(ok), share_s),
        "output_tokens_per_s": _ratio(tokens, share_s),
        "ttft_s": distribution([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_s": distribution([v for r in ok if (v := tpot(r)) is not None]),
        "itl_s": distribution([g for r in ok for g in inter_chunk_gaps(r)]),
        "e2e_s": distribution([r.e2e_s for r in ok if r.e2e_s is not None]),
        **speculation_figures([r.stats for r in ok if r.stats]),
        "acceptance_by_position": acceptance_by_position(ok),
    }


RATIO_KEYS = ("request_throughput_rps", "output_tokens_per_s", "acceptance_rate", "mean_accepted_per_round")
LATENCY_RATIO_KEYS = ("ttft_s", "tpot_s", "e2e_s")


def ratios_to(summaries: dict[str, dict[str, Any]], base: str = "ar") -> dict[str, dict[str, float]]:
    """Each mode's figures divided by the base mode's (throughputs: > 1 is faster; latencies: < 1 is faster)."""
    if base not in summaries:
        return {}
    b = summaries[base]
    out: dict[str, dict[str, float]] = {}
    for mode, s in summaries.items():
        row = {key: _ratio(s[key], b[key]) for key in RATIO_KEYS[:2]}
        row.update({f"{key}_mean": _ratio(s[key]["mean"], b[key]["mean"]) for key in LATENCY_RATIO_KEYS})
        out[mode] = row
    return out


def summarize_level(records: Sequence[RequestRecord], modes: Sequence[str], window_s: float) -> dict[str, Any]:
    """Per-mode summaries, ratios to ar and the whole window's totals for one concurrency or rate."""
    busy_all = sum(r.e2e_s or 0.0 for r in records if r.ok)
    summaries = {m: summarize_mode([r for r in records if r.mode == m], window_s, busy_all) for m in modes}
    ok = [r for r in records if r.ok]
    return {
        "window_s": window_s,
        "total": {
            "requests": len(records),
            "ok": len(ok),
            "request_throughput_rps": _ratio(len(ok), window_s),
            "output_tokens_per_s": _ratio(sum(r.output_tokens for r in ok), window_s),
        },
        "modes": summaries,
        "ratios_to_ar": ratios_to(summaries),
    }

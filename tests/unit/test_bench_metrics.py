"""Bench metrics: percentiles, per-round acceptance derived from the stream, window shares, ratios."""

from __future__ import annotations

import math

import pytest

from calispec_tools.bench.metrics import (
    RequestRecord,
    acceptance_by_position,
    percentile,
    round_acceptance,
    summarize_level,
    tpot,
)


def test_percentile_interpolates_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]  # unsorted on purpose
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 90) == pytest.approx(3.7)  # numpy.percentile([1,2,3,4], 90)
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(values, 101)


def record(
    mode: str, chunks: list[int], e2e: float, stats: dict[str, float] | None = None, gamma: int = 4
) -> RequestRecord:
    r = RequestRecord(slot=0, mode=mode, prompt_index=0, max_new_tokens=100, gamma=0 if mode == "ar" else gamma)
    r.chunk_tokens = chunks
    r.chunk_offsets_s = [0.1 * (i + 1) for i in range(len(chunks))]
    r.ttft_s = r.chunk_offsets_s[0]
    r.e2e_s = e2e
    r.finish_reason = "length"
    drafted = 0.0 if mode == "ar" else 8.0
    r.stats = stats or {"drafted": drafted, "accepted": drafted / 2, "rounds": 2.0, "emitted": 6.0, "rescued": 1.0,
                        "rejections": 2.0, "draft_ms": 10.0, "target_ms": 30.0, "memory_ms": 0.0,
                        "coordinator_ms": 10.0, "total_ms": 50.0}  # fmt: skip
    return r


def test_round_acceptance_skips_the_last_chunk_and_ar() -> None:
    # rounds emit accepted + 1 tokens: 5 = all 4 accepted + bonus, 1 = rejected at position 1
    r = record("sd", [5, 1, 3, 2], e2e=1.0)
    assert round_acceptance(r) == [(4, 4), (4, 0), (4, 2)]
    assert round_acceptance(record("ar", [1, 1, 1], e2e=1.0)) == []


def test_round_acceptance_follows_the_coordinators_gamma_clip() -> None:
    r = record("sd", [5, 1, 1], e2e=1.0)
    r.max_new_tokens = 6  # after 5 tokens one remains: the next round drafts min(4, 6 - 5 - 1) = 0
    assert round_acceptance(r) == [(4, 4)]
    r.max_new_tokens = 7  # two remain: it drafts one, and its single token means that one was rejected
    assert round_acceptance(r) == [(4, 4), (1, 0)]


def test_acceptance_by_position() -> None:
    by_pos = acceptance_by_position([record("sd", [5, 1, 3, 2], e2e=1.0)])
    assert by_pos == {
        1: pytest.approx(2 / 3),
        2: pytest.approx(2 / 3),
        3: pytest.approx(1 / 3),
        4: pytest.approx(1 / 3),
    }


def test_tpot_excludes_the_first_token() -> None:
    r = record("sd", [2, 3], e2e=0.5)  # ttft 0.1, 5 tokens
    assert tpot(r) == pytest.approx((0.5 - 0.1) / 4)
    r.error = "UNAVAILABLE"
    assert tpot(r) is None


def test_summarize_level_shares_the_window_and_ratios_to_ar() -> None:
    fast = record("ar", [1] * 6, e2e=1.0)
    slow = record("sd", [3, 3], e2e=3.0)
    failed = record("sd", [1], e2e=1.0)
    failed.error, failed.e2e_s = "DEADLINE_EXCEEDED", None
    level = summarize_level([fast, slow, failed], ["ar", "sd"], window_s=4.0)
    ar, sd = level["modes"]["ar"], level["modes"]["sd"]
    assert ar["window_share_s"] == pytest.approx(1.0) and sd["window_share_s"] == pytest.approx(3.0)
    assert ar["output_tokens_per_s"] == pytest.approx(6.0) and sd["output_tokens_per_s"] == pytest.approx(2.0)
    assert level["ratios_to_ar"]["sd"]["output_tokens_per_s"] == pytest.approx(1 / 3)
    assert level["ratios_to_ar"]["sd"]["e2e_s_mean"] == pytest.approx(3.0)
    assert sd["errors"] == {"DEADLINE_EXCEEDED": 1} and sd["ok"] == 1 and sd["requests"] == 2
    assert sd["acceptance_rate"] == pytest.approx(0.5)
    assert sd["mean_accepted_per_round"] == pytest.approx(2.0)
    assert sd["rescue_rate"] == pytest.approx(0.5)
    assert sd["time_shares"]["target"] == pytest.approx(0.6)
    assert level["total"]["request_throughput_rps"] == pytest.approx(2 / 4)

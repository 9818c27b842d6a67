"""Probability-ratio spread: aggregation of hand-built events, one hand-built verify round, the report."""

from __future__ import annotations

import json
import math

import pytest
import torch

from calispec_tools.eval import report
from calispec_tools.eval.ratios import RatioEvent, aggregate, quantile, rank_pairs, round_events

LN10 = math.log(10.0)


def events() -> list[RatioEvent]:
    a = [RatioEvent(1, 2, v) for v in (-3.0, -1.0, -5.0, -2.0, -4.0)]  # the most frequent pair, out of order
    b = [RatioEvent(3, 4, v) for v in (-0.5, -20.0)]
    c = [RatioEvent(0, 9, v) for v in (-2.0, -3.0)]  # ties with b on count: lower ids rank first
    d = [RatioEvent(5, 6, -7.0), RatioEvent(5, 6, -math.inf)]  # -inf: a masked logit, not a ratio
    return [*a, *b, *c, *d]


def test_quantile_interpolates_linearly_like_numpy() -> None:
    values = [-5.0, -4.0, -3.0, -2.0, -1.0]
    assert [quantile(values, q) for q in (0.0, 0.1, 0.25, 0.5, 0.9, 1.0)] == pytest.approx(
        [-5.0, -4.6, -4.0, -3.0, -1.4, -1.0]
    )
    assert quantile([2.5], 0.9) == 2.5 and math.isnan(quantile([], 0.5))


def test_rank_pairs_by_count_then_ids() -> None:
    ranked = rank_pairs(events())
    assert [(pair, len(vals)) for pair, vals in ranked] == [((1, 2), 5), ((0, 9), 2), ((3, 4), 2), ((5, 6), 2)]


def test_aggregate_exact_spread_gate_share_and_labels() -> None:
    doc = aggregate(events(), decode=lambda t: f"<{t}>", top=3, tau=0.01)
    assert doc["events"] == 10 and doc["non_finite_events"] == 1 and doc["distinct_pairs"] == 4
    assert [(p["rank"], p["draft_token_id"], p["target_token_id"], p["count"]) for p in doc["top_pairs"]] == [
        (1, 1, 2, 5), (2, 0, 9, 2), (3, 3, 4, 2)
    ]  # fmt: skip
    first = doc["top_pairs"][0]
    assert first["draft_text"] == "<1>" and first["target_text"] == "<2>"
    assert first["log_ratio"] == pytest.approx(
        {"min": -5.0, "q10": -4.6, "q25": -4.0, "q50": -3.0, "q75": -2.0, "q90": -1.4, "max": -1.0, "decades": 4 / LN10}
    )
    assert first["gate_pass_share"] == pytest.approx(0.8)  # log 0.01 = -4.61: only -5 fails
    assert first["log_ratios"] == [-3.0, -1.0, -5.0, -2.0, -4.0]  # event order kept
    spread_pair = doc["top_pairs"][2]  # one pair, both sides of the gate: the paper's point
    assert spread_pair["gate_pass_share"] == 0.5 and spread_pair["log_ratio"]["decades"] == pytest.approx(19.5 / LN10)
    assert doc["overall_log_ratio"]["min"] == -20.0 and doc["overall_log_ratio"]["max"] == -0.5
    assert doc["overall_gate_pass_share"] == pytest.approx(7 / 10)


def test_aggregate_without_events() -> None:
    doc = aggregate([])
    assert doc["events"] == 0 and doc["top_pairs"] == [] and doc["overall_log_ratio"] is None
    assert "no rejection events" in report.format_ratios(doc)


def test_round_events_reads_the_ratio_at_the_rejected_position() -> None:
    logits = torch.full((1, 4, 5), -1.0)  # [1, G+1, V]
    logits[0, 0, 2] = 3.0  # position 0: argmax 2 == draft 2, accepted
    logits[0, 1, 0], logits[0, 1, 3] = 2.0, -0.5  # position 1: argmax 0, draft 3 rejected
    logits[0, 2, 1] = 9.0
    accepted, next_token, evs = round_events(logits, [2, 3, 1])
    assert (accepted, next_token) == (1, 0)
    assert evs == [RatioEvent(3, 0, pytest.approx(-2.5))]  # z(3) − z(0); position 2 is never reached
    logits[0, 1, 3] = 5.0  # now the draft wins everywhere: no events, the bonus from position 3
    logits[0, 3, 4] = 1.0
    assert round_events(logits, [2, 3, 1]) == (3, 4, [])


def test_ratio_report_text_json_and_png(tmp_path) -> None:
    doc = aggregate(events(), decode=lambda t: f"t{t}", top=3)
    text = report.format_ratios(doc, top=2)
    assert "10 events, 4 pairs" in text and "#1 't1'→'t2' ×5" in text and "#3" not in text
    path = report.write_json(tmp_path / "eval.json", {"rejections": {"probability_ratio": doc}})
    assert json.loads(path.read_text())["rejections"]["probability_ratio"]["top_pairs"][0]["count"] == 5
    import matplotlib  # noqa: F401 - the `bench` extra, installed by `make install`

    png = report.plot_ratios(tmp_path / "ratios.png", doc)
    assert png.read_bytes()[:4] == b"\x89PNG"

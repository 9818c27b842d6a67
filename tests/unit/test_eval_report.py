"""Eval reports: coverage curve, variants, the paper-style summary, JSON and PNG writers."""

from __future__ import annotations

import itertools
import json

import pytest

from calispec_tools.eval import report
from calispec_tools.eval.rejections import analyse, coverage_curve, gained, share_at
from calispec_tools.eval.runner import variants


def test_coverage_curve_of_a_skewed_table() -> None:
    counts = [70, 10, 5, 5, 4, 3, 1, 1, 1, 0]  # zero counts are not pairs
    curve = coverage_curve(counts, points=9)
    assert curve[-1] == (1.0, 1.0)
    assert share_at(curve, 1 / 9) == pytest.approx(0.7)  # the top pair holds 70 of 100 events
    assert all(b >= a for (_, a), (_, b) in itertools.pairwise(curve))
    assert coverage_curve([]) == []


def test_analyse_labels_top_pairs_and_says_what_is_missing() -> None:
    a = analyse([(1, 2, 3), (5, 6, 30), (7, 8, 1)], decode=lambda t: f"<{t}>")
    assert a["events"] == 34 and a["distinct_pairs"] == 3
    assert a["top_pairs"][0] == {"draft_token_id": 5, "target_token_id": 6, "count": 30,
                                 "draft_text": "<5>", "target_text": "<6>"}  # fmt: skip
    assert "--ratio-analysis" in a["probability_ratio"]


def test_variants_add_the_tau_lambda_grid() -> None:
    v = variants(["ar", "csd"], [0.01, 0.1], [6])
    assert [x.label for x in v] == ["ar", "csd", "csd τ=0.1 λ=6"]  # the default cell is csd itself
    assert len(variants(["ar"], [], [2, 6])) == 3  # without csd the default cell runs
    assert [x.label for x in variants(["csd"], [0.01], [2])] == ["csd", "csd τ=0.01 λ=2"]


def row(variant: str, kind: str, correct: bool, emitted: int, total_ms: float, accepted: int = 0) -> dict:
    stats = {"drafted": 0 if variant == "ar" else 12, "accepted": accepted, "rescued": 1 if variant == "csd" else 0,
             "rounds": 4, "emitted": emitted, "total_ms": total_ms, "rejections": 2,
             **({"withheld_rescues": 1} if variant == "csd" else {})}  # fmt: skip  # ar: a row from before the field
    return {"task": "t", "kind": kind, "variant": variant, "correct": correct, "error": None, "stats": stats}


def summary() -> dict:
    rows = [row("ar", "code", True, 10, 1000), row("ar", "math", False, 10, 1000),
            row("csd", "code", True, 10, 500, 9), row("csd", "math", True, 10, 500, 9)]  # fmt: skip
    return report.summarize(rows)


def test_summary_speedup_and_accuracy() -> None:
    s = summary()
    assert s["ar"]["accuracy"] == 0.5 and s["csd"]["accuracy"] == 1.0
    assert s["csd"]["accuracy_by_kind"] == {"code": 1.0, "math": 1.0}
    assert s["csd"]["speedup_vs_ar"] == pytest.approx(2.0)
    assert s["csd"]["acceptance_rate"] == pytest.approx(18 / 24)
    assert (s["ar"]["withheld"], s["csd"]["withheld"]) == (0, 2)  # rescues the meaning guard refused
    table = report.format_table(s)
    assert "2.00×" in table and table.splitlines()[0].startswith("variant") and "withheld" in table


def test_round_ending_rejections_leave_out_the_rescued_ones() -> None:
    """`rejections` counts rejection events, the rescued ones too: wave 28's README read csd's events (281) as
    its round-ending rejections, and reported -4.4 % against sd where the rounds a rejection ended fell 25.5 %."""
    s = summary()
    assert (s["ar"]["rejections"], s["csd"]["rejections"]) == (4, 4)
    assert (s["ar"]["round_ending_rejections"], s["csd"]["round_ending_rejections"]) == (4, 2)
    header, _, csd = report.format_table(s).splitlines()
    assert csd.split()[header.split().index("rej-end")] == "2"


def test_a_runs_rejections_are_what_it_added_to_the_table() -> None:
    before = [(1, 2, 5), (3, 4, 2), (9, 9, 7)]  # (9, 9) is evicted during the run
    after = [(1, 2, 8), (3, 4, 2), (5, 6, 1)]
    assert gained(before, after) == [(1, 2, 3), (5, 6, 1)]
    text = report.format_rejections({**analyse(gained(before, after)), "memory_table": analyse(after)})
    assert text.startswith("rejections in this run: 4 events over 2 pairs")
    assert "the memory table after it: 11 events over 3 pairs" in text


def test_json_and_png(tmp_path) -> None:
    analysis = analyse([(1, 2, 3), (5, 6, 30)])
    path = report.write_json(tmp_path / "eval.json", {"summary": summary(), "rejections": analysis, "rows": []})
    doc = json.loads(path.read_text())
    assert doc["schema"] == report.SCHEMA and doc["summary"]["ar"]["acceptance_rate"] is None
    assert doc["rejections"]["coverage_curve"][-1] == {"pair_share": 1.0, "event_share": 1.0}
    import matplotlib  # noqa: F401 - the `bench` extra, installed by `make install`

    png = report.plot_rejections(tmp_path / "rejections.png", analysis)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_failed_requests_are_named_under_the_table_not_only_counted_as_wrong() -> None:
    """Every request refused (a bad key, no coordinator): the table read "accuracy 0.0%" and nothing said why (wave
    50, found by probing)."""
    failed = {
        "task": "t",
        "kind": "math",
        "variant": "csd",
        "correct": False,
        "error": "UNAUTHENTICATED",
        "stats": None,
    }
    rows = [row("ar", "math", True, 10, 1000), failed, {**failed, "task": "u"}]
    s = report.summarize(rows)
    assert s["csd"]["error_codes"] == {"UNAUTHENTICATED": 2} and s["ar"]["error_codes"] == {}
    lines = report.format_table(s).splitlines()
    assert lines[-1] == "csd: 2 of 2 requests failed (UNAUTHENTICATED ×2); counted as wrong answers"
    assert len(lines) == 4  # the header, ar, csd, and one line for csd's failures (none for ar, which had none)

"""Calibration study: which prompts calibrate each variant, and the per-variant summary and table."""

from __future__ import annotations

import math

import pytest

from calispec_tools.eval import report
from calispec_tools.eval.calibration import calibration_prompts, summarize_study


def test_calibration_sets_are_the_same_size_and_differ_in_text() -> None:
    assert calibration_prompts("none", ["code", "math"], 2) == []
    general = calibration_prompts("general", ["code", "math"], 2)
    task = calibration_prompts("task", ["code", "math"], 2)
    assert len(general) == len(task) == 4
    assert {p.source for p in general} == {"prose"} and [p.source for p in task] == ["code", "code", "math", "math"]
    assert len(calibration_prompts("task", ["math"], None)) > 2  # no limit: the whole set
    chat = calibration_prompts("task", ["code"], 1, prompt_format="qwen-chat")
    assert chat[0].text.startswith("<|im_start|>user\n") and task[0].text in chat[0].text
    with pytest.raises(ValueError, match="calibration variant"):
        calibration_prompts("corpus", ["code"], 1)


def row(calibration: str, variant: str, correct: bool, total_ms: float, rescued: int = 0) -> dict:
    stats = {"drafted": 0 if variant == "ar" else 10, "accepted": 0 if variant == "ar" else 6 + rescued,
             "rescued": rescued, "rounds": 4, "emitted": 20, "total_ms": total_ms,
             "rejections": 0 if variant == "ar" else 4}  # fmt: skip
    return {"task": "t", "kind": "math", "variant": variant, "calibration": calibration, "correct": correct,
            "error": None, "stats": stats}  # fmt: skip


def test_summarize_study_per_variant() -> None:
    rows = [row("none", "ar", True, 1000), row("none", "csd", True, 500),
            row("task", "ar", True, 1200), row("task", "csd", False, 400, rescued=2)]  # fmt: skip
    calibration = {"none": {"prompts": 0, "events": 0}, "task": {"prompts": 4, "events": 17}}
    s = summarize_study(rows, calibration)
    assert list(s) == ["none", "task"]
    assert s["none"]["rescue_rate"] == 0.0 and s["none"]["speedup_vs_ar"] == pytest.approx(2.0)
    assert s["task"]["rescue_rate"] == pytest.approx(2 / 4) and s["task"]["acceptance_rate"] == pytest.approx(0.8)
    assert s["task"]["speedup_vs_ar"] == pytest.approx(3.0)  # against the same stack's ar, not another's
    assert s["task"]["accuracy"] == 0.0 and s["task"]["calibration_events"] == 17
    table = report.format_study(s).splitlines()
    assert table[0].startswith("calibration") and table[2].split()[:3] == ["task", "4", "17"]
    assert "3.00×" in table[2] and "50.0%" in table[2]


def test_summarize_study_without_rejections_has_no_rescue_rate() -> None:
    rows = [row("none", "ar", True, 1000), {**row("none", "csd", False, 500), "stats": None, "error": "UNAVAILABLE"}]
    s = summarize_study(rows, {"none": {"prompts": 0, "events": 0}})
    assert math.isnan(s["none"]["rescue_rate"]) and s["none"]["accuracy"] == 0.0

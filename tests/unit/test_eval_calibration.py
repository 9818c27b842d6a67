"""Calibration study: what calibrates each variant, the per-calibration summary, the tables."""

from __future__ import annotations

import math

import pytest

from calispec_tools.eval import report
from calispec_tools.eval.calibration import calibration_documents, summarize_study


def test_calibration_documents_per_variant() -> None:
    assert calibration_documents("none", ["code", "math"], 2) == []
    task = calibration_documents("task", ["code", "math"], 2)
    files = [d.source.rsplit(":", 1)[0].rsplit("/", 1)[-1] for d in task]
    assert files == ["code_stubs.jsonl"] * 2 + ["math_problems.jsonl"] * 2 and all(d.is_prompt for d in task)
    assert task[0].text.startswith("def ") and task[2].text.startswith("Question: ")  # the tasks' raw formats
    assert not any("/prompts/" in d.source or "/eval/" in d.source for d in task)  # never near copies of tasks
    assert len(calibration_documents("task", ["math"], None)) > 2  # no limit: the whole set
    chat = calibration_documents("task", ["code"], 1, prompt_format="qwen-chat")
    assert chat[0].text.startswith("<|im_start|>user\n") and task[0].text in chat[0].text
    shipped = calibration_documents("shipped", ["code"])  # the repo's corpus: documents and prompts
    assert any(d.is_prompt for d in shipped) and any(not d.is_prompt for d in shipped)
    assert not any("eval" in d.source for d in shipped)  # never the evaluation tasks
    with pytest.raises(ValueError, match="calibration variant"):
        calibration_documents("corpus", ["code"], 1)


def row(calibration: str, variant: str, correct: bool, total_ms: float, rescued: int = 0) -> dict:
    stats = {"drafted": 0 if variant == "ar" else 10, "accepted": 0 if variant == "ar" else 6 + rescued,
             "rescued": rescued, "rounds": 4, "emitted": 20, "total_ms": total_ms,
             "rejections": 0 if variant == "ar" else 4}  # fmt: skip
    return {"task": "t", "kind": "math", "variant": variant, "calibration": calibration, "correct": correct,
            "error": None, "stats": stats}  # fmt: skip


def test_summarize_study_per_calibration_and_variant() -> None:
    rows = [row("none", "ar", True, 1000), row("none", "csd", True, 500),
            row("task", "ar", True, 1200), row("task", "csd", False, 400, rescued=2)]  # fmt: skip
    s = summarize_study(rows, {"none": {}, "task": {}})
    assert list(s) == ["none", "task"] and list(s["task"]) == ["ar", "csd"]
    assert s["none"]["csd"]["rescue_rate"] == 0.0 and s["none"]["csd"]["speedup_vs_ar"] == pytest.approx(2.0)
    task = s["task"]["csd"]
    assert task["rescue_rate"] == pytest.approx(2 / 4) and task["acceptance_rate"] == pytest.approx(0.8)
    assert task["speedup_vs_ar"] == pytest.approx(3.0)  # against the same stack's ar, not another's
    assert task["accuracy"] == 0.0 and task["rejections"] == 4 and math.isnan(s["task"]["ar"]["rescue_rate"])
    table = report.format_study(s).splitlines()
    assert table[0].startswith("calibration") and table[4].split()[:2] == ["task", "csd"]
    assert "3.00×" in table[4] and "50.0%" in table[4]


def test_concentration_report_beside_the_paper() -> None:
    curve = [{"pair_share": 0.2, "event_share": 0.5}, {"pair_share": 1.0, "event_share": 1.0}]
    before = {"events": 100, "distinct_pairs": 10, "top20_share": 0.5, "coverage_curve": curve}
    after = {"events": 130, "distinct_pairs": 12, "top20_share": 0.6, "coverage_curve": curve}
    info = {"shipped": {"before": before, "after": after}}
    text = report.format_concentration(info)
    assert "paper: ~69%" in text and "50.0%" in text and "60.0%" in text


def test_study_plan_runs_memory_independent_modes_once() -> None:
    from calispec_tools.eval.calibration import study_plan
    from calispec_tools.eval.runner import variants

    plan = study_plan(["none", "shipped", "task"], variants(["ar", "sd", "csd", "ocm_only", "scg_only"], [0.1], [20]))
    shipped = [v.label for v in plan["shipped"]]
    assert shipped == ["csd", "ocm_only", "csd τ=0.1 λ=20", "ar", "sd", "scg_only"]  # memory readers first
    assert [v.label for v in plan["none"]] == [v.label for v in plan["task"]] == ["csd", "ocm_only"]
    assert [v.label for v in study_plan(["none", "task"], variants(["ar", "csd"]))["none"]] == ["csd", "ar"]


def test_summarize_study_falls_back_to_the_reference_ar() -> None:
    rows = [row("shipped", "csd", True, 500), row("shipped", "ar", True, 1000), row("none", "csd", True, 800)]
    s = summarize_study(rows, {"shipped": {}, "none": {}}, order=["ar", "csd"])
    assert list(s["shipped"]) == ["ar", "csd"]  # the requested order, not the run order
    assert s["none"]["csd"]["speedup_vs_ar"] == pytest.approx(1.25)  # the shipped stack's ar

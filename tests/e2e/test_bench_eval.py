"""`calispec bench` and `calispec eval` end to end against the tiny stack (few requests, short outputs)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calispec_tools.cli_bench import main

try:
    import matplotlib  # noqa: F401

    HAVE_MATPLOTLIB = True
except ImportError:  # the `bench` extra is not installed: exercise everything but the PNGs
    HAVE_MATPLOTLIB = False
from calispec_tools.stack import LocalStack
from tests.conftest import TinyPair
from tests.e2e.test_stack import stack_config

# prompts from the tiny pair's corpus, so that it writes more than one token before EOS
TINY_PROMPTS = ["def fibonacci(n):", "The robot counted", "Question: what is 12 plus 30?"]


@pytest.fixture(scope="module")
def stack(tiny_pair: TinyPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with LocalStack(stack_config(tmp_path_factory.mktemp("bench-stack"), tiny_pair.draft, tiny_pair.target)) as s:
        yield s


def prompts_file(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "max_new_tokens": 12}) + "\n" for p in TINY_PROMPTS))
    return path


def test_bench_closed_loop_sweep(stack: LocalStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench"
    argv = ["bench", "--address", stack.coordinator_address, "--prompts", str(prompts_file(tmp_path)),
            "--modes", "ar,sd,csd", "--concurrency", "1,2", "--num-requests", "9", "--gamma", "4",
            "--out", str(out)]  # fmt: skip
    argv += [] if HAVE_MATPLOTLIB else ["--no-plots"]
    assert main(argv) == 0
    doc = json.loads((out / "bench.json").read_text())
    assert doc["config"]["load"]["modes"] == ["ar", "sd", "csd"]
    assert [lv["level"]["concurrency"] for lv in doc["levels"]] == [1, 2]
    for level in doc["levels"]:
        assert level["total"]["ok"] == 9 and len(level["records"]) == 9
        assert level["ratios_to_ar"]["ar"]["output_tokens_per_s"] == pytest.approx(1.0)
        assert level["modes"]["sd"]["acceptance_rate"] is not None
        # greedy float32 sd is exact: per prompt, it emits exactly as many tokens as ar
        lengths = {(r["mode"], r["prompt_index"]): sum(r["chunk_tokens"]) for r in level["records"]}
        assert all(lengths[("sd", p)] == lengths[("ar", p)] for m, p in lengths if m == "ar")
    table = capsys.readouterr().out
    assert "concurrency 1" in table and "csd" in table
    if HAVE_MATPLOTLIB:
        assert all((out / name).stat().st_size > 0 for name in ("latency_cdf.png", "throughput.png", "acceptance.png"))


def test_bench_over_the_openai_api(stack: LocalStack, tmp_path: Path) -> None:
    out = tmp_path / "bench-openai"
    argv = ["bench", "--openai-url", str(stack.http_url), "--prompts", str(prompts_file(tmp_path)),
            "--modes", "ar,sd", "--num-requests", "6", "--no-plots", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    level = json.loads((out / "bench.json").read_text())["levels"][0]
    assert level["total"]["ok"] == 6
    # token ids come back per chunk (return_token_ids), and greedy sd still matches ar in length
    lengths = {(r["mode"], r["prompt_index"]): sum(r["chunk_tokens"]) for r in level["records"]}
    assert all(n > 0 for n in lengths.values())
    assert all(lengths[("sd", p)] == lengths[("ar", p)] for m, p in lengths if m == "ar")


def test_bench_open_loop(stack: LocalStack, tmp_path: Path) -> None:
    out = tmp_path / "bench-open"
    argv = ["bench", "--address", stack.coordinator_address, "--prompts", str(prompts_file(tmp_path)),
            "--modes", "ar,sd", "--rate", "20", "--burstiness", "0.5", "--num-requests", "4", "--warmup", "0",
            "--no-plots", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    level = json.loads((out / "bench.json").read_text())["levels"][0]
    assert level["level"] == {"concurrency": None, "rate": 20.0}
    assert [r["slot"] for r in level["records"]] == [0, 1, 2, 3]
    assert all(r["error"] is None and r["ttft_s"] <= r["e2e_s"] for r in level["records"])


def run_eval_cli(stack: LocalStack, out: Path) -> dict[str, Any]:
    namespace = getattr(stack, "memory_namespace", None) or "default"
    argv = ["eval", "--address", stack.coordinator_address, "--memory-address",
            stack.memory_address, "--memory-namespace", namespace,
            "--tokenizer", str(stack.config.target_model), "--modes", "ar,sd,csd", "--limit", "1",
            "--max-new-tokens", "16", "--out", str(out)]  # fmt: skip
    argv += [] if HAVE_MATPLOTLIB else ["--no-plots"]
    assert main(argv) == 0
    return json.loads((out / "eval.json").read_text())


def test_eval_table_and_rejection_analysis(
    stack: LocalStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rejection analysis is the run's own: it described the whole memory table, so after a seeded calibration
    91.5 % of the events it reported (wave 54's eval: 6,226 against the run's 528) were not the run's."""
    first = run_eval_cli(stack, tmp_path / "first")  # the memory now holds events of an earlier run
    out = tmp_path / "eval"
    doc = run_eval_cli(stack, out)
    assert list(doc["summary"]) == ["ar", "sd", "csd"]
    assert len(doc["rows"]) == 2 * 3  # one code and one math task, three modes
    assert all(r["status"] in {"passed", "failed", "timeout", "correct", "wrong"} for r in doc["rows"])
    assert doc["summary"]["ar"]["speedup_vs_ar"] == pytest.approx(1.0)
    rejections = [sum(r["stats"]["rejections"] for r in run["rows"]) for run in (first, doc)]
    analysis = doc["rejections"]
    # this run's events, not the table's: the first run's last flush may still land during this one (the stack's
    # verifiers ship events in the background), so at most it comes on top
    assert rejections[1] <= analysis["events"] <= sum(rejections)
    assert analysis["events"] < analysis["memory_table"]["events"]  # the table holds the earlier runs' too
    if rejections[1]:
        assert analysis["coverage_curve"][-1]["event_share"] == pytest.approx(1.0)
        assert not HAVE_MATPLOTLIB or (out / "rejections.png").stat().st_size > 0
    printed = capsys.readouterr().out.split("rejections in this run:")
    assert printed[-1].strip() and "the memory table after it:" in printed[-1]


def test_eval_ratio_analysis_json_and_png(stack: LocalStack, tmp_path: Path) -> None:
    """--ratio-analysis loads the pair in process: greedy SD over the 2 tasks, ratios per pair."""
    out = tmp_path / "eval-ratios"
    argv = ["eval", "--address", stack.coordinator_address, "--modes", "ar", "--limit", "1",
            "--max-new-tokens", "32", "--ratio-analysis", "--draft", str(stack.config.draft_model),
            "--target", str(stack.config.target_model), "--dtype", "float32", "--device", "cpu",
            "--out", str(out)]  # fmt: skip
    argv += [] if HAVE_MATPLOTLIB else ["--no-plots"]
    assert main(argv) == 0
    ratios = json.loads((out / "eval.json").read_text())["rejections"]["probability_ratio"]
    assert ratios["prompts"] == 2 and ratios["events"] > 0 and ratios["top_pairs"]
    counts = [p["count"] for p in ratios["top_pairs"]]
    assert counts == sorted(counts, reverse=True) and sum(counts) <= ratios["events"]
    for pair in ratios["top_pairs"]:
        assert len(pair["log_ratios"]) == pair["count"] and isinstance(pair["draft_text"], str)
        assert all(math.isfinite(v) and v <= 0 for v in pair["log_ratios"])  # greedy: z(draft) <= z(argmax)
        assert pair["log_ratio"]["min"] <= pair["log_ratio"]["q50"] <= pair["log_ratio"]["max"] <= 0
    if HAVE_MATPLOTLIB:
        assert (out / "ratios.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow  # three tiny stacks one after another, the shipped corpus calibrated here
@pytest.mark.timeout(600)
def test_eval_calibration_study(tiny_pair: TinyPair, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three fresh stacks (none, shipped corpus, task-like text), each its own memory: ar, sd, csd on 2 tasks."""
    out = tmp_path / "eval-study"
    argv = ["eval", "--local", "--draft", str(tiny_pair.draft), "--target", str(tiny_pair.target), "--dtype",
            "float32", "--device", "cpu", "--modes", "ar,sd,csd", "--limit", "1", "--calibration-limit", "2",
            "--max-new-tokens", "16", "--calibration-study", "--calibration-batch-size", "64",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    study = json.loads((out / "eval.json").read_text())["calibration_study"]
    assert list(study["summary"]) == ["none", "shipped", "task"]
    calibration = study["calibration"]
    assert calibration["none"]["events"] == 0 and calibration["none"]["before"]["events"] == 0
    for label in ("shipped", "task"):  # teacher-forced here (the tiny pair ships no file): in the memory at once
        before = calibration[label]["before"]
        assert calibration[label]["events"] > 0 and before["recorded_events"] == calibration[label]["events"]
        # the table holds what the caps kept (a draft token keeps at most max_pairs_per_draft targets): no more
        # than recorded, and the difference is reported, not lost silently
        assert before["events"] + before["dropped_events"] == before["recorded_events"]
    for label, info in calibration.items():  # after the tasks: their own rejection events, every one
        before, after = info["before"], info["after"]
        ran = sum(r["stats"]["rejections"] for r in study["rows"] if r["calibration"] == label and r["stats"])
        assert after["recorded_events"] == before["recorded_events"] + ran
        assert after["events"] + after["dropped_events"] == after["recorded_events"]
    # ar and sd never read the memory: they run on the reference (shipped) stack only, csd on all three
    assert len(study["rows"]) == 2 * 3 + 2 * 2  # tasks × (csd ×3 calibrations, ar and sd once)
    assert all(r["error"] is None for r in study["rows"])
    assert list(study["summary"]["shipped"]) == ["ar", "sd", "csd"] and list(study["summary"]["none"]) == ["csd"]
    assert study["summary"]["shipped"]["ar"]["speedup_vs_ar"] == 1.0
    for per_variant in study["summary"].values():
        assert 0 <= per_variant["csd"]["acceptance_rate"] <= 1 and per_variant["csd"]["speedup_vs_ar"] > 0
    printed = capsys.readouterr().out
    assert "calibration study" in printed and "rejection concentration" in printed
    dropped = calibration["shipped"]["before"]["dropped_events"]
    assert not dropped or f"{dropped} of {calibration['shipped']['events']} recorded events dropped" in printed
    assert (out / "concentration.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("memory", ["plenty", "short"])
def test_bench_calibration_rounds(
    tiny_pair: TinyPair, memory: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SD through a fresh tiny stack and teacher forcing, two rounds: interleaved where the pair fits beside the
    stack, one after the other otherwise. In float32 the teacher-forced `--generate` events are the stack's own,
    every one of them, when the rounds' shares are added up (docs/calibration.md)."""
    free = {"plenty": 1 << 40, "short": 0}[memory]  # what the host has is not the test's business
    monkeypatch.setattr("calispec_core.host_memory.available_bytes", lambda: free)
    argv = ["bench", "calibration", "--draft", str(tiny_pair.draft), "--target", str(tiny_pair.target),
            "--dtype", "float32", "--device", "cpu", "--prompts", "3", "--rounds", "2", "--gamma", "4",
            "--max-new-tokens", "16", "--no-text"]  # fmt: skip
    assert main(argv) == 0
    report = capsys.readouterr().out
    if memory == "plenty":
        assert "rounds=2 (interleaved: ~" in report and "  round 2: SD " in report and "  round 3" not in report
    else:
        assert "rounds=2 of SD, then teacher forcing with the stack stopped (not interleaved" in report
        assert "by round" not in report
    assert "teacher_target_linear=" in report  # which Linear path the teacher-forced target ran (packed: as served)
    rows = {line[:34].strip(): line[34:].split() for line in report.splitlines() if line.startswith(("SD", "teacher"))}
    sd_events = int(rows["SD through the stack (γ=4)"][0])
    assert sd_events > 0 and int(rows["teacher-forced --generate (sd)"][0]) == sd_events
    assert f"holds {sd_events} of the SD run's {sd_events} events (100.0%); 0 others" in report

"""`calispec bench` and `calispec eval` end to end against the tiny stack (few requests, short outputs)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from calispec.cli_bench import main

try:
    import matplotlib  # noqa: F401

    HAVE_MATPLOTLIB = True
except ImportError:  # the `bench` extra is not installed: exercise everything but the PNGs
    HAVE_MATPLOTLIB = False
from calispec.stack import LocalStack
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
            "--modes", "ar,sd,csd", "--concurrency", "1,2", "--num-requests", "9", "--out", str(out)]  # fmt: skip
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


def test_eval_table_and_rejection_analysis(
    stack: LocalStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval"
    namespace = getattr(stack, "memory_namespace", None) or "default"
    argv = ["eval", "--address", stack.coordinator_address, "--memory-address",
            stack.services["memory_service"].address, "--memory-namespace", namespace,
            "--tokenizer", str(stack.config.target_model), "--modes", "ar,sd,csd", "--limit", "1",
            "--max-new-tokens", "16", "--out", str(out)]  # fmt: skip
    argv += [] if HAVE_MATPLOTLIB else ["--no-plots"]
    assert main(argv) == 0
    doc = json.loads((out / "eval.json").read_text())
    assert list(doc["summary"]) == ["ar", "sd", "csd"]
    assert len(doc["rows"]) == 2 * 3  # one code and one math task, three modes
    assert all(r["status"] in {"passed", "failed", "timeout", "correct", "wrong"} for r in doc["rows"])
    assert doc["summary"]["ar"]["speedup_vs_ar"] == pytest.approx(1.0)
    rejections = sum(r["stats"]["rejections"] for r in doc["rows"])
    analysis = doc["rejections"]
    assert analysis["events"] >= rejections  # the memory holds at least this run's events
    if rejections:
        assert analysis["coverage_curve"][-1]["event_share"] == pytest.approx(1.0)
        assert not HAVE_MATPLOTLIB or (out / "rejections.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert printed.startswith("variant") and "rejections:" in printed

"""`calispec bench compare`'s report: the load table carries acceptance and batch size (no models)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from calispec_tools.bench.compare import format_report


def test_load_levels_report_throughput_ratio_acceptance_and_batch() -> None:
    level = {"requests": 16, "tokens": 100, "seconds": 10.0, "tokens_per_s": 10.0, "acceptance": 0.5, "max_batch": 8}
    load = {"ar": {8: {**level, "acceptance": float("nan"), "max_batch": 8}},
            "csd": {8: {**level, "tokens_per_s": 12.5, "acceptance": 0.75, "max_batch": 6}}}  # fmt: skip
    lines = format_report({"dtype": "bf16"}, {}, {}, load).splitlines()
    assert lines[0] == "environment: dtype=bf16"
    csd = next(line for line in lines if line.startswith("csd ") and "12.50" in line)
    assert csd.split()[-1] == "1.25"  # × ar
    assert lines[-1].split() == ["csd", "75.0%", "|", "6"]


def test_the_environment_names_the_instruction_set_caps_in_force(monkeypatch) -> None:
    from calispec_tools.bench.compare import ISA_CAP_VARS, isa_caps

    for name in ISA_CAP_VARS:
        monkeypatch.delenv(name, raising=False)
    assert isa_caps().startswith("none (aten ")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", "AVX2")
    assert isa_caps().startswith("ONEDNN_MAX_CPU_ISA=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 (aten ")


def test_the_environment_names_the_dtype_auto_resolves_to(monkeypatch) -> None:
    from calispec_core import modeling

    cpu = torch.device("cpu")
    monkeypatch.setattr(modeling, "cpu_has_fast_bf16", lambda: False)
    assert modeling.serving_dtype_name("auto", cpu) == "float32"
    monkeypatch.setattr(modeling, "cpu_has_fast_bf16", lambda: True)
    assert modeling.serving_dtype_name("auto", cpu) == "bfloat16"
    assert modeling.serving_dtype_name("int8", cpu) == "int8"


def test_full_concurrency_window_ends_when_the_first_client_runs_out() -> None:
    from calispec_tools.bench.compare import StreamedRequest, full_concurrency_window

    def request(*chunks: tuple[float, int]) -> StreamedRequest:
        return StreamedRequest(list(chunks))

    # 4 requests over 2 clients: two in flight until the 3rd completion (t = 7), then one drains alone
    results = [request((1, 2), (3, 2)), request((2, 1), (5, 1)), request((4, 3), (7, 3)), request((6, 5), (20, 5))]
    seconds, tokens = full_concurrency_window(results, 2)
    assert seconds == 7
    assert tokens == 2 + 2 + 1 + 1 + 3 + 3 + 5  # everything streamed by t = 7, none of the drain's last chunk
    assert full_concurrency_window(results, 8) == (0.0, 0)  # fewer requests than clients: never 8 in flight
    assert full_concurrency_window([], 2) == (0.0, 0)


def test_the_report_adds_full_concurrency_throughput_with_its_ratio() -> None:
    level = {"requests": 16, "tokens": 100, "seconds": 10.0, "tokens_per_s": 10.0, "acceptance": 0.5, "max_batch": 8,
             "full_concurrency_s": 8.0, "full_concurrency_tokens_per_s": 11.0}  # fmt: skip
    load = {"ar": {8: level}, "csd": {8: {**level, "tokens_per_s": 9.0, "full_concurrency_tokens_per_s": 16.5}}}
    lines = format_report({"dtype": "bf16"}, {}, {}, load).splitlines()
    title = lines.index("throughput while every client had a request in flight (until the first ran out):")
    csd_rows = [i for i, line in enumerate(lines) if line.startswith("csd ") and "|" not in line]
    assert [lines[i].split()[-1] for i in csd_rows] == ["0.90", "1.50"]  # over all requests, at full concurrency
    assert csd_rows[0] < title < csd_rows[1]


def test_repeated_levels_report_medians_and_paired_ratios() -> None:
    from calispec_tools.bench.compare import combine_repeats

    def run(tps: float, full: float) -> dict[str, float]:
        return {"tokens_per_s": tps, "full_concurrency_tokens_per_s": full, "acceptance": 0.7, "max_batch": 8}

    ar = [run(20, 20), run(10, 10), run(30, 30)]  # the machine drifted between repeats
    csd = [run(24, 26), run(13, 12), run(33, 39)]  # 1.2x, 1.3x, 1.1x of ar in the same repeat
    combined = combine_repeats(csd, ar)
    assert combined["tokens_per_s"] == 24 and combined["tokens_per_s_runs"] == [24, 13, 33]
    assert combined["tokens_per_s_x_ar"] == pytest.approx(1.2)  # paired; the ratio of medians would also be 1.2
    assert combined["full_concurrency_tokens_per_s_x_ar"] == pytest.approx(1.3)  # 1.3, 1.2, 1.3: the ratio of
    # medians (26 / 20) would also be 1.3, so check one that differs:
    assert combine_repeats([run(10, 10), run(40, 40), run(11, 11)], ar)["tokens_per_s_x_ar"] == pytest.approx(0.5)
    load = {"ar": {8: combine_repeats(ar, ar)}, "csd": {8: combined}}
    lines = format_report({"dtype": "bf16"}, {}, {}, load).splitlines()
    csd_rows = [line.split() for line in lines if line.startswith("csd ") and "|" not in line and ":" not in line]
    assert [row[-1] for row in csd_rows] == ["1.20", "1.30"]
    assert "csd    c=8: 24.00 13.00 33.00" in lines


def test_load_repeats_must_be_at_least_one() -> None:
    import argparse

    from calispec_core.limits import positive_int

    assert positive_int("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match="must be >= 1, got 0"):
        positive_int("0")


def test_interleaved_runs_take_turns_going_first() -> None:
    """A fixed order met a slower machine for its later modes on every prompt; rotated, each goes first once."""
    from types import SimpleNamespace

    from calispec_tools.bench.compare import HF_VARIANTS, STACK_MODES, CompareConfig, Run, run_interleaved

    order: list[tuple[int, str]] = []

    class Client:
        def generate(self, prompt: str, mode: str, **kwargs: object) -> SimpleNamespace:
            order.append((int(prompt), mode))
            return SimpleNamespace(token_ids=[1], stats=SimpleNamespace(to_dict=dict))

    class Hf:
        def run(self, variant: str, index: int, prompt: str, max_new_tokens: int) -> Run:
            order.append((index, variant))
            return Run(variant, index, 1, 1.0, [1])

    variants = [*STACK_MODES, *HF_VARIANTS]
    config = CompareConfig([str(i) for i in range(len(variants))], 4, None, [], 0)
    runs = run_interleaved(Client(), Hf(), config, lambda run: None)  # type: ignore[arg-type]
    assert len(runs) == len(variants) ** 2
    firsts = [next(v for i, v in order if i == prompt) for prompt in range(len(variants))]
    assert sorted(firsts) == sorted(variants)  # every variant led one prompt
    for prompt in range(len(variants)):
        assert sorted(v for i, v in order if i == prompt) == sorted(variants)  # and each prompt ran them all


def test_load_repeats_take_turns_going_first(monkeypatch) -> None:
    from calispec_tools.bench import compare

    order: list[str] = []

    def level(address: str, mode: str, concurrency: int, config: object) -> dict[str, float]:
        order.append(mode)
        return {"tokens_per_s": 1.0, "full_concurrency_tokens_per_s": 1.0}

    monkeypatch.setattr(compare, "load_level", level)
    config = compare.CompareConfig(["p"], 4, None, [8], 0, load_repeats=3)
    compare.run_load("unused", config)
    n = len(compare.STACK_MODES)
    firsts = [order[i * n] for i in range(3)]
    assert sorted(firsts) == sorted(compare.STACK_MODES)  # each mode led one repeat
    assert all(sorted(order[i * n : (i + 1) * n]) == sorted(compare.STACK_MODES) for i in range(3))


@pytest.mark.parametrize(
    ("flags", "seeded", "guard"),
    [([], True, True), (["--no-calibration"], False, True), (["--no-meaning-guard"], True, False)],
)
def test_compare_benchmarks_the_stack_up_serves(tmp_path: Path, flags: list[str], seeded: bool, guard: bool) -> None:
    """`bench compare` ran csd on an empty memory while `up` seeds the shipped calibration, and accepted
    --no-calibration without effect."""
    from calispec_tools.bench.compare import compare_stack_config
    from calispec_tools.cli import build_parser
    from calispec_tools.shipped_calibration import shipped_file

    args = build_parser().parse_args(["bench", "compare", "--pair", "qwen-coder", *flags])
    args.model_dirs = (tmp_path / "draft", tmp_path / "target")
    config = compare_stack_config(args, tmp_path)
    assert config.calibration_file == (shipped_file("qwen-coder") if seeded else None)
    assert config.calibration_file != (None if seeded else shipped_file("qwen-coder"))
    assert config.meaning_guard is guard
    assert config.calibration_lambdas == ((("bfloat16", 4), ("float32", 4)) if seeded and guard else ())  # as `up`
    assert config.memory_db.parent == tmp_path and config.coordinator_port == 0


def test_on_cuda_the_warm_up_runs_a_whole_request() -> None:
    """An 8-token warm-up left the first 96-token request on an H200 at a third of the speed of the next ones."""
    from calispec_tools.bench.compare import warm_up_tokens

    assert warm_up_tokens("cuda", 96) == 96 and warm_up_tokens("cuda:0", 64) == 64
    assert warm_up_tokens("cpu", 96) == 8


@pytest.mark.parametrize("flags", [[], *(["--lockstep-phase", rule] for rule in ("median", "group", "shared"))])
def test_compare_and_up_pass_the_lockstep_phase_to_the_coordinator(tmp_path: Path, flags: list[str]) -> None:
    """`bench compare` had no way to measure the coordinator's group phase (wave 37: opt-in until it did), nor
    `calispec up` to serve another rule; without the flag the coordinator's own default stands."""
    from calispec_tools.bench.compare import compare_stack_config
    from calispec_tools.cli import build_parser, stack_config
    from calispec_tools.stack import LocalStack

    parser = build_parser()
    bench = parser.parse_args(["bench", "compare", "--pair", "qwen-coder", *flags])
    bench.model_dirs = (tmp_path / "draft", tmp_path / "target")
    dirs = ["--draft", str(tmp_path / "draft"), "--target", str(tmp_path / "target")]
    up = parser.parse_args(["up", *dirs, *flags])
    for config in (compare_stack_config(bench, tmp_path), stack_config(up, (0, 0, 0, 0))):
        args = LocalStack(config).coordinator_args("127.0.0.1:2", ["127.0.0.1:3", "127.0.0.1:4"])
        assert args[args.index("--lockstep-phase") :][:2] == flags if flags else "--lockstep-phase" not in args
        assert args.count("--target-addr") == 2 and args[args.index("--draft-addr") + 1] == "127.0.0.1:2"


def test_the_report_says_how_much_memory_the_loaded_models_left() -> None:
    """A float32 target packed in the stack beside Hugging Face's float32 pair left 1.2 GiB of a 23.6 GiB VM, and
    the stack's sd ran 1.4-1.9x slower than without HF's pair (wave 47): such a run must say so."""
    from calispec_core.host_memory import GIB
    from calispec_tools.bench.compare import memory_left

    assert memory_left(6 * GIB) == ("6.0 GiB", None)
    left, warning = memory_left(GIB + GIB // 5)
    assert left == "1.2 GiB (short)" and warning is not None and "--skip-hf" in warning and "inflated" in warning
    assert memory_left(None) == ("unknown", None)


def test_the_largest_batch_is_the_largest_of_all_repeats() -> None:
    """It was the median of each repeat's largest: 7.5 for repeats that saw 8 and 7 (found by an audit)."""
    from calispec_tools.bench.compare import combine_repeats

    def run(batch: int) -> dict[str, float]:
        return {"tokens_per_s": 10.0, "full_concurrency_tokens_per_s": 10.0, "acceptance": 0.7, "max_batch": batch}

    assert combine_repeats([run(8), run(7)], [run(8), run(8)])["max_batch"] == 8


def test_a_mode_that_never_drafted_has_no_acceptance_not_zero() -> None:
    """Its row read "accept 0.0%  acc/rnd 0.00", as if every drafted token had been rejected (found by an audit)."""
    from calispec_tools.bench.compare import Run, ratios, speculation_figures

    stats = {"rounds": 10, "target_only_rounds": 10, "accepted": 0, "drafted": 0, "emitted": 10, "mean_gamma": 0.0,
             "round_overhead_ms": 5.0, "total_ms": 500.0}  # fmt: skip
    figures = speculation_figures([Run("sd", 0, 10, 1.0, list(range(10)), stats=stats)])
    assert math.isnan(figures["acceptance"]) and math.isnan(figures["accepted_per_drafting_round"])
    summary = {"ar": {"tokens_per_s": 10.0}, "sd": {"tokens_per_s": 10.0, **figures}}
    sd = next(line for line in format_report({}, summary, ratios(summary), {}).splitlines() if line.startswith("sd "))
    assert sd.split()[3:6] == ["-", "-", "-"]  # × assist (no HF run), acceptance, accepted per drafting round


def test_the_json_report_is_strict_json(tmp_path: Path) -> None:
    """`ar`'s load acceptance is NaN, which json.dumps wrote as a bare NaN that JSON parsers refuse."""
    from calispec_tools.bench.compare import write_json

    path = tmp_path / "compare.json"
    write_json(path, {"load": {"ar": {8: {"acceptance": float("nan"), "tokens_per_s": 40.9}}}})
    assert json.loads(path.read_text(), parse_constant=pytest.fail) == {
        "load": {"ar": {"8": {"acceptance": None, "tokens_per_s": 40.9}}}
    }

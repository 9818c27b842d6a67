"""Serving dtypes and threads: int8 draft, torch threads per service, the stack's core split, the draft vocabulary."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

from calispec_core import service_cli
from calispec_core.modeling import DTYPE_CHOICES, ModelRunner, ModelSpec, apply_threads
from calispec_core.protocol import model_info_to_pb
from calispec_tools.cli import add_model_flavour_args, draft_vocab
from calispec_tools.models.registry import PAIRS
from calispec_tools.shipped_calibration import SeedResult
from calispec_tools.stack import LocalStack, StackConfig, default_draft_vocab, service_threads, split_cores
from tests.conftest import TinyPair


def test_the_cli_offers_exactly_the_dtypes_the_runner_knows() -> None:
    assert service_cli.DTYPE_CHOICES == DTYPE_CHOICES


@torch.inference_mode()
def test_int8_runner_quantises_its_linear_layers_and_stays_close_to_float32(
    tiny_pair: TinyPair, draft_runner: ModelRunner
) -> None:
    int8 = ModelRunner(ModelSpec(tiny_pair.draft, dtype="int8", device="cpu"))
    quantised = [m for m in int8.model.modules() if isinstance(m, DynamicQuantizedLinear)]
    assert quantised and model_info_to_pb(int8).dtype == "int8"
    ids = [5, 17, 42, 8, 99]
    a = int8.forward(ids, int8.new_cache(), 1)[0, -1]
    b = draft_runner.forward(ids, draft_runner.new_cache(), 1)[0, -1]
    assert a.dtype == torch.float32 and torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.99


def test_apply_threads_sets_torch_intra_op_threads() -> None:
    before = torch.get_num_threads()
    try:
        apply_threads(1)
        assert torch.get_num_threads() == 1
        apply_threads(None)  # None keeps whatever is set
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_core_split_is_disjoint_and_gives_the_target_the_larger_share() -> None:
    assert split_cores(1) == (1, 1)
    assert split_cores(2) == (1, 1)
    for cores in (3, 4, 8, 16, 64):
        draft, target = split_cores(cores)
        assert draft + target == cores and 1 <= draft < target


def test_explicit_threads_win_over_the_split(tmp_path) -> None:
    config = StackConfig(tmp_path, tmp_path, tmp_path / "m.db", tmp_path, draft_threads=2, target_threads=6)
    assert service_threads(config) == (2, 6)


def test_the_stack_passes_draft_vocab_to_the_draft_service_only(tiny_pair: TinyPair, tmp_path) -> None:
    base = StackConfig(tiny_pair.draft, tiny_pair.target, tmp_path / "m.db", tmp_path)
    assert "--draft-vocab" not in LocalStack(base).draft_args()  # 0: the full layer, no flag
    stack = LocalStack(replace(base, draft_vocab=4096))
    args = stack.draft_args()
    assert args[args.index("--draft-vocab") + 1] == "4096"
    assert "--draft-vocab" not in stack.target_args(0, "127.0.0.1:1")


def test_the_stack_passes_the_batch_gather_time_to_both_model_services(tiny_pair: TinyPair, tmp_path) -> None:
    base = StackConfig(tiny_pair.draft, tiny_pair.target, tmp_path / "m.db", tmp_path)
    assert "--batch-gather-ms" not in LocalStack(base).draft_args()  # None: the services' default
    stack = LocalStack(replace(base, batch_gather_ms=0.0))
    for args in (stack.draft_args(), stack.target_args(0, "127.0.0.1:1")):
        assert args[args.index("--batch-gather-ms") + 1] == "0.0"


def test_the_stack_passes_the_prefix_cache_size_and_benchmarks_turn_it_off(tiny_pair: TinyPair, tmp_path) -> None:
    from calispec_tools.cli import build_parser

    base = StackConfig(tiny_pair.draft, tiny_pair.target, tmp_path / "m.db", tmp_path)
    assert "--prefix-cache-tokens" not in LocalStack(base).target_args(0, "127.0.0.1:1")  # the services' default
    stack = LocalStack(replace(base, prefix_cache_tokens=0))
    for args in (stack.draft_args(), stack.target_args(0, "127.0.0.1:1")):
        assert args[args.index("--prefix-cache-tokens") + 1] == "0"
    # the compared modes repeat each prompt: a cache would hand the later ones free prefills
    parser = build_parser()
    assert parser.parse_args(["bench", "compare"]).prefix_cache_tokens == 0
    assert parser.parse_args(["eval", "--local"]).prefix_cache_tokens == 0
    for command in (["bench", "compare"], ["eval", "--local"]):
        with pytest.raises(SystemExit):
            parser.parse_args([*command, "--prefix-cache-tokens", "-1"])


def test_the_fp32_linear_path_reaches_both_model_services(tiny_pair: TinyPair, tmp_path) -> None:
    """`--fp32-linear default` puts the stack on torch's float32 path, the cost curve of a CPU without bf16 units."""
    from calispec_tools.cli import build_parser, stack_config

    parser = build_parser()
    config = stack_config(parser.parse_args(["up", "--pair", "tiny"]), (0, 0, 0, 0))
    assert "--fp32-linear" not in LocalStack(config).draft_args()  # the services' default (auto)
    config = stack_config(parser.parse_args(["up", "--pair", "tiny", "--fp32-linear", "default"]), (0, 0, 0, 0))
    stack = LocalStack(config)
    for args in (stack.draft_args(), stack.target_args(0, "127.0.0.1:1")):
        assert args[args.index("--fp32-linear") + 1] == "default"
    assert parser.parse_args(["bench", "compare", "--fp32-linear", "default"]).fp32_linear == "default"
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--fp32-linear", "mkl"])


def test_up_maps_the_csd_defaults_onto_the_coordinator(tiny_pair: TinyPair, tmp_path) -> None:
    from calispec_tools.cli import build_parser, stack_config

    parser = build_parser()
    args = parser.parse_args(["up", "--pair", "tiny", "--default-lambda", "20", "--default-tau", "0.1"])
    config = stack_config(args, (0, 0, 0, 0))
    assert (config.default_tau, config.default_lambda) == (0.1, 20)
    spawned = LocalStack(config).csd_default_args()
    assert spawned == ["--default-tau", "0.1", "--default-lambda", "20"]
    assert LocalStack(replace(config, default_tau=None, default_lambda=None)).csd_default_args() == []
    for bad in (["--default-tau", "0"], ["--default-lambda", "-1"], ["--default-lambda", str(2**31)]):
        with pytest.raises(SystemExit):
            parser.parse_args(["up", *bad])


def calibrated_stack(config: StackConfig, target_dtype: str | None, present: bool = True) -> LocalStack:
    """A stack as start() leaves it: the seed's result and the dtype the target's banner named."""
    stack = LocalStack(config)
    stack.calibration = SeedResult(present, "", present=present)
    stack.target_dtype = target_dtype
    return stack


def test_the_calibrations_lambda_is_the_default_for_the_dtype_it_was_chosen_on(tmp_path: Path) -> None:
    """A shipped calibration's λ (shipped_calibration.CHOSEN_LAMBDA) becomes the coordinator's default only on
    a target dtype it was chosen for; --default-lambda wins over it."""
    config = StackConfig(tmp_path, tmp_path, tmp_path / "m.db", tmp_path, calibration_lambdas=(("float32", 3),))
    stack = calibrated_stack(config, "float32")
    assert stack.csd_default_args() == ["--default-lambda", "3"]
    assert "λ = 3 (chosen for the shipped calibration, float32" in stack.csd_defaults_message()
    assert "taken to hold it" not in stack.csd_defaults_message()  # loaded by this start
    held = calibrated_stack(config, "float32")
    held.calibration = SeedResult(False, "", present=True)  # the namespace held counts: not loaded again
    assert held.csd_defaults_message().endswith(
        "docs/calibration.md; the memory is taken to hold it, as its namespace held counts before)"
    )  # an upgraded memory may hold an older file, or traffic only: said, since nothing tells them apart (wave 55)
    for other in ("bfloat16", None):
        assert calibrated_stack(config, other).csd_default_args() == []
    assert calibrated_stack(config, "bfloat16").csd_defaults_message() == "CSD defaults: τ = 0.01, λ = 6 (the paper's)"
    explicit = calibrated_stack(replace(config, default_lambda=20, default_tau=0.1), "float32")
    assert explicit.csd_default_args() == ["--default-tau", "0.1", "--default-lambda", "20"]
    assert explicit.csd_defaults_message() == "CSD defaults: τ = 0.1 (--default-tau), λ = 20 (--default-lambda)"


@pytest.mark.parametrize(
    ("change", "present"),
    [
        ({}, False),  # the file was refused (its hash or namespace): the memory does not hold it
        ({"meaning_guard": False}, True),  # λ was chosen for the guarded rule
        ({"default_tau": 0.1}, True),  # λ was chosen with τ = 0.01
    ],
)
def test_the_calibrations_lambda_is_served_only_where_it_was_chosen(
    tmp_path: Path, change: dict[str, object], present: bool
) -> None:
    """It was served when the shipped file had been refused (`calibration not loaded: ...`, then λ = 3)."""
    config = StackConfig(tmp_path, tmp_path, tmp_path / "m.db", tmp_path, calibration_lambdas=(("float32", 3),))
    stack = calibrated_stack(replace(config, **change), "float32", present)  # type: ignore[arg-type]
    assert "--default-lambda" not in stack.csd_default_args()
    assert "λ = 6 (the paper's)" in stack.csd_defaults_message()


@pytest.mark.parametrize(
    ("flags", "lambdas"),
    [
        ([], (("bfloat16", 4), ("float32", 4))),
        (["--no-calibration"], ()),  # no calibration seeded: nothing λ was chosen for
        (["--no-meaning-guard"], ()),  # λ was chosen for the guarded rule
        (["--pair", "tiny"], ()),  # no shipped calibration
    ],
)
def test_up_takes_the_lambda_chosen_for_the_calibration_it_seeds(
    flags: list[str], lambdas: tuple[tuple[str, int], ...]
) -> None:
    from calispec_tools.cli import build_parser, calibration_lambdas

    assert calibration_lambdas(build_parser().parse_args(["up", "--pair", "qwen-coder", *flags])) == lambdas


def test_draft_vocab_defaults_to_the_pairs_cpu_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PAIRS, "qwen-coder", replace(PAIRS["qwen-coder"], cpu_draft_vocab=1234))
    assert default_draft_vocab("qwen-coder", "cpu") == 1234
    assert default_draft_vocab("qwen-coder", "cuda") == 0
    assert default_draft_vocab("tiny", "cpu") == 0 and default_draft_vocab(None, "cpu") == 0
    parser = argparse.ArgumentParser()
    add_model_flavour_args(parser)
    assert draft_vocab(parser.parse_args(["--device", "cpu"]), "qwen-coder") == 1234
    assert draft_vocab(parser.parse_args(["--device", "cpu", "--draft-vocab", "0"]), "qwen-coder") == 0  # explicit wins
    assert draft_vocab(parser.parse_args(["--device", "cpu"]), None) == 0  # explicit model directories


def test_auto_dtype_is_bf16_only_where_the_cpu_has_bf16_units_and_onednn_may_use_them(monkeypatch) -> None:
    from calispec_core import modeling

    cpu = torch.device("cpu")
    monkeypatch.setattr(modeling, "cpu_flags_text", lambda: "flags : fpu avx2 avx512f avx512_bf16")
    monkeypatch.setattr(modeling, "onednn_bf16_usable", lambda: True)
    assert modeling.resolve_dtype("auto", cpu) == torch.bfloat16
    # bf16 units, but oneDNN capped below them (ONEDNN_MAX_CPU_ISA=AVX2): bf16 would run emulated, slowly
    monkeypatch.setattr(modeling, "onednn_bf16_usable", lambda: False)
    assert modeling.resolve_dtype("auto", cpu) == torch.float32
    monkeypatch.setattr(modeling, "onednn_bf16_usable", lambda: True)
    monkeypatch.setattr(modeling, "cpu_flags_text", lambda: "flags : fpu avx2 avx512f")
    assert modeling.resolve_dtype("auto", cpu) == torch.float32


def test_an_onednn_isa_cap_below_avx512_makes_bf16_unusable() -> None:
    import subprocess
    import sys

    code = "from calispec_core.modeling import onednn_bf16_usable; print(onednn_bf16_usable())"
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_up_sets_every_services_log_level(tiny_pair: TinyPair) -> None:
    """The coordinator's per-round DEBUG lines need `calispec up --log-level DEBUG` to reach the services."""
    from calispec_tools.cli import build_parser, stack_config

    parser = build_parser()
    assert stack_config(parser.parse_args(["up", "--pair", "tiny"]), (0, 0, 0, 0)).log_level == "INFO"
    assert (
        stack_config(parser.parse_args(["up", "--pair", "tiny", "--log-level", "DEBUG"]), (0, 0, 0, 0)).log_level
        == "DEBUG"
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--log-level", "CHATTY"])


@pytest.mark.parametrize("command", [["up"], ["demo"]])
def test_no_meaning_guard_reaches_the_target_service(tiny_pair: TinyPair, command: list[str], tmp_path: Path) -> None:
    """Its own --log-dir: the compute lock lives there, and the default (the user data dir) exists only on a
    machine that has run a stack (a fresh clone's `make test` failed here)."""
    from calispec_tools.cli import build_parser, stack_config
    from target_service.__main__ import parse_config

    parser = build_parser()
    for flags, guard in (([], True), (["--no-meaning-guard"], False)):
        args = parser.parse_args([*command, "--pair", "tiny", "--log-dir", str(tmp_path), *flags])
        config = stack_config(args, (0, 0, 0, 0))
        assert config.meaning_guard is guard
        spawned = LocalStack(config).target_args(0, "127.0.0.1:1")
        assert ("--no-meaning-guard" in spawned) is not guard
        assert parse_config(spawned)[0].meaning_guard is guard  # the flag as the service parses it


def test_eval_and_bench_local_stacks_take_no_meaning_guard(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """`--local` builds its own StackConfig: the flag must reach it; with --address it can do nothing."""
    from contextlib import contextmanager

    from calispec_tools import cli_bench, stack
    from calispec_tools.cli import build_parser

    configs: list[StackConfig] = []

    @contextmanager
    def fake_stack(config: StackConfig):
        configs.append(config)
        addresses = {"coordinator_address": "c", "memory_address": "m", "memory_namespace": "n"}
        yield argparse.Namespace(**addresses, writer_token_file=None)

    monkeypatch.setattr(stack, "LocalStack", fake_stack)
    parser = build_parser()
    for command in (["eval"], ["bench"]):
        args = parser.parse_args([*command, "--local", "--no-meaning-guard"])
        monkeypatch.setattr(cli_bench, "model_dirs", lambda args: (tmp_path, tmp_path))
        with cli_bench.endpoints(args):
            pass
        assert configs.pop().meaning_guard is False
        with pytest.raises(SystemExit) as refused:
            cli_bench.endpoints(parser.parse_args([*command, "--address", "h:1", "--no-meaning-guard"])).__enter__()
        assert refused.value.code == 2

"""`calispec bench compare`'s in-process peer: HF loads the pair in the dtypes the stack serves."""

from __future__ import annotations

from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

from calispec_tools.bench.compare import HfPair
from tests.conftest import TinyPair

PROMPT = "def add(a, b):"


def linear_kinds(model: nn.Module) -> set[type]:
    return {type(m) for m in model.modules() if isinstance(m, (nn.Linear, DynamicQuantizedLinear))}


def test_an_int8_stack_draft_is_an_int8_assistant_too(tiny_pair: TinyPair) -> None:
    """The stack serves its CPU draft in int8; an assistant in float32 would compare a slower draft."""
    hf = HfPair(tiny_pair.draft, tiny_pair.target, "float32", "cpu", draft_dtype="int8")
    assert linear_kinds(hf.draft) == {DynamicQuantizedLinear}
    assert linear_kinds(hf.target) == {nn.Linear}
    plain = hf.run("hf_generate", 0, PROMPT, 12)
    for variant in ("hf_assisted_default", "hf_assisted_gamma6"):  # greedy assisted decoding is lossless
        assert hf.run(variant, 0, PROMPT, 12).token_ids == plain.token_ids


def test_without_a_draft_dtype_both_models_take_the_stacks_dtype(tiny_pair: TinyPair) -> None:
    hf = HfPair(tiny_pair.draft, tiny_pair.target, "float32", "cpu")
    assert linear_kinds(hf.draft) == linear_kinds(hf.target) == {nn.Linear}


def test_hf_loads_before_the_stack_so_auto_sees_the_memory_it_took(monkeypatch, tmp_path) -> None:
    """The services' `--fp32-linear auto` packs where free memory allows; a peer loaded after them took that
    memory and got the packed target OOM-killed (wave 14)."""
    from pathlib import Path

    import calispec_tools.stack as stack_module
    from calispec_tools.bench import compare
    from calispec_tools.cli import build_parser

    order: list[str] = []

    class Peer:
        def __init__(self, *args, **kwargs) -> None:
            order.append("hf")

    class Stack:
        def __init__(self, config) -> None:
            self.config = config

        def __enter__(self):
            order.append("stack")
            raise RuntimeError("stop here")

        def __exit__(self, *exc) -> None:
            return None

    monkeypatch.setattr(compare, "HfPair", Peer)
    monkeypatch.setattr(stack_module, "LocalStack", Stack)
    args = build_parser().parse_args(["bench", "compare", "--pair", "tiny"])
    args.model_dirs, args.prompt_texts = (Path(tmp_path / "d"), Path(tmp_path / "t")), ["x"]
    try:
        compare.run_compare(args)
    except RuntimeError as exc:
        assert str(exc) == "stop here"
    assert order == ["hf", "stack"]


def test_kinds_picks_the_built_in_prompts_of_those_kinds(monkeypatch) -> None:

    from calispec_tools.bench import compare
    from calispec_tools.bench.pair import PROMPTS
    from calispec_tools.cli import build_parser

    seen: list[list[str]] = []
    monkeypatch.setattr(compare, "run_compare", lambda args: seen.append(args.prompt_texts) or 0)
    parser = build_parser()
    args = parser.parse_args(["bench", "compare", "--pair", "tiny", "--kinds", "prose", "--prompts", "3"])
    monkeypatch.setattr("calispec_tools.cli_bench.bench_pair_dirs", lambda args: ("d", "t"))
    assert args.func(args) == 0 and seen == [PROMPTS["prose"] * 3]
    args = parser.parse_args(["bench", "compare", "--pair", "tiny", "--kinds", "math,code", "--prompts", "3"])
    assert args.func(args) == 0 and seen[-1] == [*PROMPTS["code"], *PROMPTS["math"]]  # in the built-in order
    args = parser.parse_args(["bench", "compare", "--pair", "tiny", "--kinds", "poetry"])
    assert args.func(args) == 2  # a usage error (it exited 1)

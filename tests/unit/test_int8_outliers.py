"""int8 Linear layers that quantise a sequence's first-token outlier rows apart (calispec_core/int8_outliers.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

from calispec_core import int8_outliers
from calispec_core.batch_forward import forward_rows
from calispec_core.errors import InvalidArgument
from calispec_core.int8_fusion import fuse_dynamic_int8
from calispec_core.int8_outliers import Int8Linear, isolating_outliers, use_int8_outlier_split
from calispec_core.modeling import ModelRunner, ModelSpec, prefill_session, quantize_int8
from calispec_core.prefix_cache import PrefixCache
from calispec_tools.calibrate.generate import continue_greedy
from calispec_tools.calibrate.teacher import greedy_predictions
from tests.conftest import TinyPair
from tests.helpers import bench_compare_service_flag
from tests.unit.test_prefix_cache import prompt


def int8_layers(*widths: int, seed: int = 3) -> tuple[torch.nn.Module, ...]:
    """Dynamic int8 Linears over 64 inputs (quantize_int8's engine), turned into Int8Linear."""
    torch.manual_seed(seed)
    layers = quantize_int8(torch.nn.Sequential(*(torch.nn.Linear(64, n) for n in widths)))
    use_int8_outlier_split(layers)
    return tuple(layers)


def rows_with_an_outlier() -> torch.Tensor:
    """[1, 6, 64]: row 0 ~40x the others' scale, as a sequence's first token is in a real model's layers."""
    torch.manual_seed(4)
    x = torch.randn(1, 6, 64)
    x[0, 0] *= 40
    return x


@torch.inference_mode()
def test_outside_the_block_the_layer_is_torchs_dynamic_linear_bitwise() -> None:
    (layer,) = int8_layers(32)
    plain = DynamicQuantizedLinear(64, 32, dtype=torch.qint8)
    plain.set_weight_bias(layer.weight(), layer.bias())
    x = rows_with_an_outlier()
    assert type(layer) is Int8Linear and torch.equal(layer(x), plain(x))


@torch.inference_mode()
def test_inside_the_block_the_outlier_row_no_longer_coarsens_the_others() -> None:
    (layer,) = int8_layers(32)
    x = rows_with_an_outlier()
    shared = layer(x)  # [1, 6, 32] one scale over all six rows
    given = x.clone()
    with isolating_outliers():
        split = layer(x)
    assert torch.equal(x, given)  # the outlier row, zeroed in place for the call, is back (q/k/v read one input)
    rest_alone = layer(x[:, 1:])  # the other five rows, quantised without the outlier
    assert torch.equal(split[:, 1:], rest_alone) and torch.equal(split[:, :1], layer(x[:, :1]))
    exact = torch.nn.functional.linear(x, layer.weight().dequantize(), layer.bias())  # [1, 6, 32]
    split_error = (split[:, 1:] - exact[:, 1:]).abs().max()
    shared_error = (shared[:, 1:] - exact[:, 1:]).abs().max()
    assert split_error * 5 < shared_error  # the shared scale is ~40x coarser for the five


@torch.inference_mode()
def test_rows_without_an_outlier_take_one_call_as_before() -> None:
    (layer,) = int8_layers(32)
    torch.manual_seed(5)
    x = torch.randn(3, 7, 64)
    with isolating_outliers():
        inside = layer(x)
        one_row = layer(x[:1, :1])
    assert torch.equal(inside, layer(x)) and torch.equal(one_row, layer(x[:1, :1]))


@torch.inference_mode()
def test_the_block_ends_with_its_scope_and_can_be_turned_off() -> None:
    (layer,) = int8_layers(32)
    x = rows_with_an_outlier()
    with isolating_outliers(False):
        off = layer(x)
    with isolating_outliers():
        pass
    assert torch.equal(off, layer(x)) and not int8_outliers._isolating.get()


@torch.inference_mode()
def test_fused_projections_stay_int8linear_and_split_the_same_rows_as_separate_calls() -> None:
    projections = int8_layers(64, 16, 16)
    fused = fuse_dynamic_int8(projections)
    assert type(fused) is Int8Linear
    x = rows_with_an_outlier()
    with isolating_outliers():
        assert torch.equal(fused(x), torch.cat([p(x) for p in projections], dim=-1))


def test_int8_runners_split_by_default_and_shared_keeps_torchs_layers(tiny_pair: TinyPair) -> None:
    split = ModelRunner(ModelSpec(tiny_pair.draft, dtype="int8", device="cpu"))
    shared = ModelRunner(ModelSpec(tiny_pair.draft, dtype="int8", device="cpu", int8_outliers="shared"))
    dynamic = [m for m in split.model.modules() if isinstance(m, DynamicQuantizedLinear)]
    assert dynamic and all(type(m) is Int8Linear for m in dynamic) and split.isolates_outliers
    assert split.decoder is not None and all(type(layer.fused_qkv) is Int8Linear for layer in split.decoder.layers)
    assert not shared.isolates_outliers
    assert not any(type(m) is Int8Linear for m in shared.model.modules())
    with pytest.raises(InvalidArgument, match="int8_outliers must be one of"):
        ModelRunner(ModelSpec(tiny_pair.draft, dtype="int8", device="cpu", int8_outliers="apart"))


class IsolationSpy:
    """Records, per forward through an Int8Linear, whether outlier rows were being isolated."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[bool] = []
        forward = Int8Linear.forward

        def spied(layer: Int8Linear, x: torch.Tensor) -> torch.Tensor:
            self.seen.append(int8_outliers._isolating.get())
            return forward(layer, x)

        monkeypatch.setattr(Int8Linear, "forward", spied)

    def take(self) -> set[bool]:
        seen, self.seen = set(self.seen), []
        return seen

    def take_calls(self) -> list[bool]:
        seen, self.seen = self.seen, []
        return seen


@pytest.mark.parametrize("lean", [True, False], ids=["lean pass", "HF pass"])
def test_forwards_holding_a_first_token_isolate_and_decode_steps_do_not(
    tiny_pair: TinyPair, monkeypatch: pytest.MonkeyPatch, lean: bool
) -> None:
    runner = ModelRunner(ModelSpec(tiny_pair.draft, dtype="int8", device="cpu", lean_forward=lean))
    assert (runner.decoder is not None) == lean
    spy = IsolationSpy(monkeypatch)
    session = prefill_session(runner, "a", [5, 17, 42, 8])
    assert spy.take() == {True}  # the prompt's chunk starts at position 0
    runner.forward([8], session.cache, 1)
    assert spy.take() == {False}  # a decode step: no first token, no extra work
    riding = prefill_session(runner, "b", [9, 10, 11], ride_tokens=128)
    assert spy.take() == set()  # a riding prompt computes nothing at Prefill...
    assert riding.riding_prefix == [9, 10]
    forward_rows(runner, [session.cache, riding.cache], [[9], [9, 10, 11]], [1, 1])
    assert spy.take() == {True}  # ...and its rows isolate in the batch that computes them
    forward_rows(runner, [session.cache, riding.cache], [[3], [4]], [1, 1])
    assert spy.take() == {False}


def test_teacher_forced_predictions_isolate_every_batch(tiny_pair: TinyPair, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = ModelRunner(ModelSpec(tiny_pair.draft, dtype="int8", device="cpu"))
    spy = IsolationSpy(monkeypatch)
    predictions = greedy_predictions(runner, [[5, 17, 42, 8], [9, 10]])
    assert [len(p) for p in predictions] == [4, 2] and spy.take() == {True}  # the layers and the output head


def test_a_prompt_whose_start_comes_from_the_prefix_cache_does_not_isolate(
    tiny_pair: TinyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = ModelRunner(ModelSpec(tiny_pair.draft, dtype="int8", device="cpu"))
    cache = PrefixCache(1024)
    system = prompt(1, 30, runner.vocab_size)
    prefill_session(runner, "a", system + prompt(2, 12, runner.vocab_size), cache)
    spy = IsolationSpy(monkeypatch)
    reused = prefill_session(runner, "b", system + prompt(3, 9, runner.vocab_size), cache)
    assert cache.stats.hits == 1 and reused.cached_len == 38
    assert spy.take() == {False}  # the shared start came from the cache: what is computed starts past position 0


def test_generated_continuations_isolate_their_first_step_only(
    tiny_pair: TinyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = ModelRunner(ModelSpec(tiny_pair.draft, dtype="int8", device="cpu"))
    spy = IsolationSpy(monkeypatch)
    assert [len(c) for c in continue_greedy(runner, [[5, 17, 42], [9, 10]], 3)] == [3, 3]
    calls = spy.take_calls()  # three forwards of the same layers: the prompts' (padded), then two decode steps
    per_forward = len(calls) // 3
    assert calls == [True] * per_forward + [False] * (2 * per_forward)


@pytest.mark.parametrize("outliers", ["split", "shared"])
def test_calibrate_loads_both_runners_with_the_flag(tiny_pair: TinyPair, outliers: str) -> None:
    from calispec_tools.calibrate.job import CalibrateConfig
    from calispec_tools.cli_calibrate import _load

    args = argparse.Namespace(draft_dtype="int8", dtype="float32", device="cpu", int8_outliers=outliers)
    calibrator = _load(args, CalibrateConfig(), tiny_pair.draft, tiny_pair.target)
    assert calibrator.draft.isolates_outliers == (outliers == "split")
    assert not calibrator.target.isolates_outliers  # float32: nothing quantises its activations


def test_the_flag_maps_onto_both_model_services_bench_compare_and_calibrate(tmp_path: Path) -> None:
    import draft_service.__main__ as draft_cli
    import target_service.__main__ as target_cli
    from calispec_tools.cli import build_parser

    base = ["--model", "m"]
    assert target_cli.parse_config(base)[0].model.int8_outliers == "split"
    assert draft_cli.parse_config([*base, "--int8-outliers", "shared"])[0].model.int8_outliers == "shared"
    with pytest.raises(SystemExit):
        draft_cli.parse_config([*base, "--int8-outliers", "apart"])
    assert bench_compare_service_flag(tmp_path, "--int8-outliers") is None  # the services' own default
    assert bench_compare_service_flag(tmp_path, "--int8-outliers", "--int8-outliers", "shared") == "shared"
    parser = build_parser()
    calibrate = parser.parse_args(["calibrate", "--corpus", "c.jsonl"])
    assert calibrate.int8_outliers == "split"  # counted as the services compute (make calibration too)
    assert parser.parse_args(["bench", "calibration", "--int8-outliers", "shared"]).int8_outliers == "shared"

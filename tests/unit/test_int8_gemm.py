"""fbgemm's dynamic int8 Linear recomputed on oneDNN's integer GEMM, bit for bit, on each path (int8_gemm.py)."""

from __future__ import annotations

import contextlib
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear
from torch.ao.quantization import per_channel_dynamic_qconfig

from calispec_core import int8_gemm
from calispec_core.argmax import argmax_last
from calispec_core.batch_forward import forward_rows
from calispec_core.compute import compute_thread
from calispec_core.int8_outliers import Int8Linear, isolating_outliers
from calispec_core.modeling import ModelRunner, ModelSpec, quantize_int8
from calispec_tools.calibrate import teacher
from tests.conftest import TinyPair

pytestmark = pytest.mark.skipif(
    "fbgemm" not in torch.backends.quantized.supported_engines, reason="the recipe redoes fbgemm's layer"
)


def int8_layer(k: int, n: int, *, per_channel: bool = False, bias: bool = False, seed: int = 0) -> Int8Linear:
    """A dynamic int8 Linear as quantize_int8 makes them (fbgemm), turned into Int8Linear."""
    torch.manual_seed(seed)
    dense = torch.nn.Sequential(torch.nn.Linear(k, n, bias=bias))
    if per_channel:  # the fused gate/up layers keep one scale per output channel
        layer = torch.ao.quantization.quantize_dynamic(dense, {torch.nn.Linear: per_channel_dynamic_qconfig})[0]
    else:
        layer = quantize_int8(dense)[0]
    layer.__class__ = Int8Linear
    return layer


def activations(rows: int, k: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=generator) * (1 + 9 * torch.rand((), generator=generator))  # [R, K]
    return x + torch.randn((), generator=generator)  # shifted: a zero point away from the middle


@pytest.mark.parametrize("path", int8_gemm.GEMM_PATHS)
@pytest.mark.parametrize("per_channel", [False, True])
@torch.inference_mode()
def test_the_integer_gemm_gives_torchs_bits_on_odd_shapes(
    per_channel: bool, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(int8_gemm, "gemm_path", lambda row_scales=False: path)
    rng = random.Random(int(per_channel))
    for trial in range(6):
        k, n, rows = rng.randrange(17, 1200), rng.randrange(17, 700), rng.randrange(128, 400)
        layer = int8_layer(k, n, per_channel=per_channel, seed=trial)
        x = activations(rows, k, seed=trial)
        if trial % 2:
            x[0] *= 40  # a first token's massive activation sets the range
        with int8_gemm.many_rows():
            assert int8_gemm.applies(layer, x)
            assert torch.equal(int8_gemm.int8_linear(layer, x), DynamicQuantizedLinear.forward(layer, x)), (k, n, rows)


@torch.inference_mode()
def test_an_activation_half_way_between_two_levels_rounds_as_fbgemm_rounds() -> None:
    """fbgemm quantises x to round(fma(x, 1/scale, zero_point)), half to even: 0.0625 at scale 0.125 and zero point
    9 is 9.5 → 10, where round(x/scale) + zero_point would give 9."""
    layer = int8_layer(8, 4)
    layer.set_weight_bias(torch.quantize_per_tensor(torch.eye(4, 8), 1 / 127, 0, torch.qint8), None)
    x = torch.zeros(130, 8)  # [R, K]
    x[:, :3] = torch.tensor([-1.125, 14.75, 0.0625])
    assert torch._choose_qparams_per_tensor(x, True) == (0.125, 9)
    expected = DynamicQuantizedLinear.forward(layer, x)  # [R, 4]
    assert expected[0, 2] == 0.125  # (10 − 9) × 0.125: the tie went up
    with int8_gemm.many_rows():
        assert torch.equal(int8_gemm.int8_linear(layer, x), expected)


def test_new_weights_are_read_again() -> None:
    layer = int8_layer(64, 32)
    x = activations(200, 64, seed=9)
    with int8_gemm.many_rows():
        int8_gemm.int8_linear(layer, x)  # caches the first weights
        layer.set_weight_bias(torch.quantize_per_tensor(torch.randn(32, 64), 0.02, 0, torch.qint8), None)
        assert torch.equal(int8_gemm.int8_linear(layer, x), DynamicQuantizedLinear.forward(layer, x))


@torch.inference_mode()
def test_the_heads_argmax_comes_from_the_accumulators_ties_included() -> None:
    layer = int8_layer(8, 3000)
    few_levels = torch.randint(-2, 3, (3000, 8)).float()  # [N, K] weights of five values: many equal logits
    layer.set_weight_bias(torch.quantize_per_tensor(few_levels, 1.0, 0, torch.qint8), None)
    x = torch.randint(0, 3, (300, 8)).float()  # [R, K]
    logits = DynamicQuantizedLinear.forward(layer, x)  # [R, N]
    tied = (logits == logits.amax(dim=-1, keepdim=True)).sum(dim=-1) > 1  # [R]
    assert tied.float().mean() > 0.5  # most rows' largest logit is shared: the first index must win
    with int8_gemm.many_rows():
        assert int8_gemm.head_applies(layer, x)
        assert torch.equal(int8_gemm.greedy_head(layer, x), logits.argmax(dim=-1))
        assert torch.equal(layer.greedy(x), logits.argmax(dim=-1))


@torch.inference_mode()
def test_greedy_splits_outlier_rows_as_the_forward_does() -> None:
    layer = int8_layer(64, 500, seed=3)
    x = activations(200, 64, seed=3)
    x[0] *= 40
    with isolating_outliers():
        expected = layer(x).argmax(dim=-1)  # fbgemm, the outlier row quantised apart
        with int8_gemm.many_rows():
            assert torch.equal(layer.greedy(x), expected)
            assert torch.equal(layer(x).argmax(dim=-1), expected)


@torch.inference_mode()
def test_serving_and_narrow_calls_keep_fbgemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only calibration asks (many_rows): a serving process keeps torch's layer and holds no second weight copy."""

    def no_gemm(*args: object) -> torch.Tensor:
        raise AssertionError("the recipe's integer GEMM called")

    layer = int8_layer(64, 32)
    biased = int8_layer(64, 32, bias=True)
    x = activations(256, 64, seed=5)
    assert int8_gemm.exact_here()  # its once-a-process check runs the GEMM: before the patch
    monkeypatch.setattr(int8_gemm, "_gemm", no_gemm)
    with isolating_outliers():
        layer(x)  # serving's prefill: outside many_rows
    with int8_gemm.many_rows():
        layer(x[:127])  # too few rows
        biased(x)  # a bias: fbgemm's fused bias add has no exact torch counterpart
        assert not int8_gemm.applies(biased, x)
        offset = int8_layer(64, 32)
        offset.set_weight_bias(torch.quantize_per_tensor(torch.randn(32, 64), 0.02, 3, torch.qint8), None)
        assert not int8_gemm.applies(offset, x)  # a weight zero point: fbgemm subtracts it times each row's sum
    assert layer not in int8_gemm._weights


def test_calibration_predictions_are_the_same_on_the_integer_gemm(
    tiny_pair: TinyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The int8 tiny draft over packed rows of 200-300 tokens: with the recipe (its forwards' int8 calls over 128
    rows or more, the head's argmax from the accumulators) and without it, the same predictions."""
    runner = ModelRunner(ModelSpec(tiny_pair.draft, dtype="int8", device="cpu"))
    assert int8_gemm.prepare(runner.model) > 0
    rng = random.Random(7)
    rows = [[rng.randrange(runner.vocab_size) for _ in range(rng.randrange(200, 300))] for _ in range(5)]
    calls = []
    gemm = int8_gemm._gemm
    monkeypatch.setattr(int8_gemm, "_gemm", lambda *args: calls.append(args[0]) or gemm(*args))
    recipe = teacher.greedy_predictions(runner, rows, 512)
    assert set(calls) == {int8_gemm.gemm_path()}  # the recipe ran
    monkeypatch.setattr(teacher.int8_gemm, "many_rows", contextlib.nullcontext)
    assert teacher.greedy_predictions(runner, rows, 512) == recipe


def test_the_recipe_is_exact_on_this_machine() -> None:
    assert int8_gemm.exact_here()


@pytest.mark.parametrize("path", int8_gemm.GEMM_PATHS)
def test_each_path_is_exact_here_sums_past_float_precision_included(path: str) -> None:
    layer, rows = int8_gemm._past_float_precision(torch.Generator().manual_seed(1))
    with int8_gemm.many_rows():
        assert int8_gemm._accumulators(layer, rows, path)[0].abs().max() > 2**24  # float(acc) rounds here
    assert int8_gemm.exact_with(path)


@torch.inference_mode()
def test_inputs_whose_sums_can_pass_float_precision_take_int_mm_on_the_matmul_path() -> None:
    """oneDNN's primitive returns float(Σ q·w) − float(zero_point · Σ w): past 2^24 that rounds twice (found by review:
    a zero point of 12 and K = 4,100 differed from fbgemm on most elements), so such layers take int_mm's int32 sum."""
    generator = torch.Generator().manual_seed(2)
    narrow, narrow_rows = int8_gemm._past_float_precision(generator, 1023)
    wide, wide_rows = int8_gemm._past_float_precision(generator, 4100)
    assert torch._choose_qparams_per_tensor(wide_rows, True)[1] != 0  # a zero point: the compensation is in play
    with int8_gemm.many_rows():
        assert torch.equal(
            int8_gemm.int8_linear(wide, wide_rows, "matmul"), DynamicQuantizedLinear.forward(wide, wide_rows)
        )
        assert int8_gemm._weights[wide].path == "int_mm"
        for path in ("int_mm", "matmul"):  # one layer on both paths in turn: its weights are read for each
            assert torch.equal(int8_gemm.int8_linear(narrow, narrow_rows, path), narrow(narrow_rows))
            assert int8_gemm._weights[narrow].path == path


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN's matmul primitive is x86's")
def test_calibration_takes_onednns_matmul_primitive_where_torch_has_it() -> None:
    """Its brgemm runs on AMX where the CPU has it: 1.8-2.0x torch._int_mm's gemm API over 512 rows (wave 46)."""
    assert int8_gemm.gemm_path() == "matmul"


def test_scaled_argmax_matches_the_float_argmax_where_the_product_rounds_neighbours_together() -> None:
    """Near 2^24 a multiplier under one float32 step rounds neighbouring accumulators onto one logit: the float
    argmax is then the first index of any of them, not the index of the largest integer."""
    generator = torch.Generator().manual_seed(11)
    rows = []
    for r in range(400):
        order = torch.randperm(64, generator=generator)  # [N] where each neighbour lands
        rows.append(16_000_000 + r - order)  # [N] the row's top accumulator and its 63 neighbours below
    acc = torch.stack(rows).to(torch.int32)  # [R, N]
    multiplier = float(torch.tensor(0.9))  # a float32 value
    expected = (acc.float() * multiplier).argmax(dim=-1)  # [R] torch's answer on the float logits
    largest_integer = acc.argmax(dim=-1)  # [R]
    assert (expected != largest_integer).sum() >= 10  # the collisions this test is about happen (19 of 400)
    assert torch.equal(int8_gemm.scaled_argmax(acc, multiplier), expected)


def one_row_at_a_time(layer: DynamicQuantizedLinear, x: torch.Tensor) -> torch.Tensor:  # [R, K] -> [R, N]
    """torch's own layer on each row alone: what serving's one-token decode steps compute."""
    return torch.cat([DynamicQuantizedLinear.forward(layer, row[None]) for row in x])


EDGE_ROWS = {  # each branch of quant_utils::ChooseQuantizationParams
    "zeros": torch.zeros(40),
    "tiny positive": torch.rand(40) * 1e-6,  # scale under 6.1e-5, min 0: max widened
    "tiny negative": -torch.rand(40) * 1e-7,  # max 0: min widened
    "tiny both signs": (torch.rand(40) - 0.7) * 1e-6,  # both scaled by the amplifier
    "all positive": torch.rand(40) + 2,
    "all negative": -torch.rand(40) * 30 - 1,
    "massive": torch.randn(40) * 500,
}


@pytest.mark.parametrize("levels", [128, 256])
def test_row_qparams_are_torchs_choice_for_each_row(levels: int) -> None:
    torch.manual_seed(0)
    rows = torch.cat([torch.stack(list(EDGE_ROWS.values())), torch.randn(200, 40) * torch.rand(200, 1) * 20])
    scale, zero_point = int8_gemm._row_qparams(rows, levels)
    for i, row in enumerate(rows):
        expected_scale, expected_zero_point = torch._choose_qparams_per_tensor(row, levels == 128)
        assert (float(scale[i]), int(zero_point[i])) == (float(torch.tensor(expected_scale)), expected_zero_point), i


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=3, max_size=24), min_size=1, max_size=6)
)
def test_row_qparams_match_torch_on_any_rows(values: list[list[float]]) -> None:
    width = min(len(v) for v in values)
    rows = torch.tensor([v[:width] for v in values], dtype=torch.float32)
    scale, zero_point = int8_gemm._row_qparams(rows, 128)
    for i, row in enumerate(rows):
        expected_scale, expected_zero_point = torch._choose_qparams_per_tensor(row, True)
        assert (float(scale[i]), int(zero_point[i])) == (float(torch.tensor(expected_scale)), expected_zero_point)


@torch.inference_mode()
def test_rows_quantise_with_fbgemms_one_rounding_where_two_steps_would_not() -> None:
    """fbgemm rounds fma(x, 1/scale, zero_point) once: x × (1/scale) = 9.4999962 then + 102 is a float32 tie that
    rounds up to 111.5 (→ 112) in two steps, while the exact 111.4999962 rounds down (→ 111). Such elements are
    about one in two million; these rows hold some, and every element must come out as fbgemm's."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(6000, 896, generator=generator) * 3  # [R, K]
    scale, zero_point = int8_gemm._row_qparams(x, 128)
    inverse, zp = (1.0 / scale).unsqueeze(1), zero_point.unsqueeze(1).float()
    two_steps = (x * inverse).add_(zp).round_().clamp_(0, 255).to(torch.uint8)  # [R, K]
    expected = torch.stack(
        [
            torch.quantize_per_tensor(row, float(s), int(z), torch.quint8).int_repr()
            for row, s, z in zip(x, scale, zero_point, strict=True)
        ]
    )
    assert (two_steps != expected).sum() >= 1  # the case this test is about happens
    assert torch.equal(int8_gemm._quantize_rows(x, scale, zero_point), expected)


@pytest.mark.parametrize("path", int8_gemm.GEMM_PATHS)
@pytest.mark.parametrize("per_channel", [False, True])
@torch.inference_mode()
def test_row_scales_give_each_row_the_bits_of_a_call_of_its_own(
    per_channel: bool, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside many_rows(row_scales=True) the rows are quantised apart: a first token's massive activation, or other
    documents in the batch, no longer move a row's outputs. Any number of rows takes the recipe (torch's layer has
    no per-row form)."""
    monkeypatch.setattr(int8_gemm, "gemm_path", lambda row_scales=False: path)
    rng = random.Random(10 + int(per_channel))
    for trial in range(4):
        k, n, rows = rng.randrange(17, 1100), rng.randrange(17, 600), rng.choice([3, 60, 300])
        layer = int8_layer(k, n, per_channel=per_channel, seed=trial)
        x = activations(rows, k, seed=trial)
        x[0] *= 40  # a first token's massive activation
        x[-1] = 0.0  # a row of zeros (scale 0.1)
        expected = one_row_at_a_time(layer, x)
        assert not torch.equal(layer(x), expected)  # one scale a call: other rows' outputs move
        with int8_gemm.many_rows(row_scales=True):
            assert int8_gemm.applies(layer, x)
            assert torch.equal(int8_gemm.int8_linear(layer, x), expected), (k, n, rows)
            assert torch.equal(layer(x), expected)  # Int8Linear takes it
            with isolating_outliers():
                assert torch.equal(layer(x), expected)  # no outlier split needed: every row has its own scale
            if not per_channel and int8_gemm._float_exact(layer):
                assert torch.equal(layer.greedy(x), expected.argmax(dim=-1))


@torch.inference_mode()
def test_row_scales_leave_layers_with_a_bias_to_fbgemm() -> None:
    """fbgemm's fused bias add has no exact counterpart here (module docstring): the q/k/v projections keep one scale
    a call, their outlier rows apart, with row scales as without."""
    biased = int8_layer(64, 32, bias=True)
    x = activations(200, 64, seed=4)
    x[0] *= 40
    with isolating_outliers():
        expected = biased(x)
        with int8_gemm.many_rows(row_scales=True):
            assert not int8_gemm.applies(biased, x)
            assert torch.equal(biased(x), expected)


def test_row_scales_are_exact_on_this_machine() -> None:
    assert int8_gemm.exact_here(row_scales=True)
    path = int8_gemm.GEMM_PATHS[0]
    with int8_gemm.many_rows(row_scales=True):  # each check sets its own mode, whatever the caller's context
        assert int8_gemm.exact_with(path, row_scales=False)
    with int8_gemm.many_rows():
        assert int8_gemm.exact_with(path, row_scales=True)


@pytest.mark.parametrize("row_scales", [False, True])
@torch.inference_mode()
def test_a_near_tie_takes_the_layers_fused_rounding(row_scales: bool) -> None:
    """The near-tie the once-a-process check holds: two float32 steps would quantise 0.2110542 to level 112, the
    layer (one fused rounding) to 111, and the recipe must give the layer's output in either mode."""
    layer = int8_layer(8, 4)
    layer.set_weight_bias(torch.quantize_per_tensor(torch.eye(4, 8), 1 / 127, 0, torch.qint8), None)
    rows = int8_gemm._near_tie(8)  # [R, 8] identical rows: one scale a call is each row's own
    scale, zero_point = int8_gemm._row_qparams(rows[:1], 128)
    assert (float(scale[0]), int(zero_point[0])) == (float(torch.tensor(0.022216244006720114)), 102)
    two_steps = float((rows[0, 2] * (1.0 / scale[0]) + zero_point[0].float()).round())
    expected = one_row_at_a_time(layer, rows)  # [R, 4]
    assert two_steps == 112 and torch.allclose(expected[:, 2], (111 - 102) * scale[0])  # the layer rounded once
    with int8_gemm.many_rows(row_scales=row_scales):
        assert torch.equal(int8_gemm.int8_linear(layer, rows), expected)


@torch.inference_mode()
def one_token_steps(runner: ModelRunner, tokens: list[int]) -> list[int]:
    """Serving's draft decoding a text one token a forward: the greedy prediction after each prefix."""
    cache = runner.new_cache()
    return [int(argmax_last(forward_rows(runner, [cache], [[t]], [1])[0][-1])) for t in tokens]


def test_row_scales_make_teacher_forcing_predict_what_one_token_steps_do(tiny_pair: TinyPair) -> None:
    """The int8 tiny draft over packed texts: with row scales every prediction is serving's one-token step's; with
    one scale a call (each packed sequence's rows together) some differ."""
    runner = ModelRunner(ModelSpec(tiny_pair.draft, dtype="int8", device="cpu"))
    compute_thread().run(int8_gemm.prepare, runner.model)
    rng = random.Random(7)
    rows = [[rng.randrange(runner.vocab_size) for _ in range(rng.randrange(150, 300))] for _ in range(4)]
    serving = [compute_thread().run(one_token_steps, runner, row) for row in rows]
    assert teacher.greedy_predictions(runner, rows, 512, row_scales=True) == serving
    assert teacher.greedy_predictions(runner, rows, 512) != serving

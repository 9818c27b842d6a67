"""float32 and bf16 Linear layers on oneDNN (calispec_core/onednn_linear.py): same logits, greedy tokens, parameters."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from calispec_core import modeling, onednn_linear
from calispec_core.compute import compute_thread
from calispec_core.errors import InvalidArgument
from calispec_core.modeling import ModelRunner, ModelSpec, cpu_has_fast_bf16, prefill_session
from calispec_core.onednn_linear import (
    OneDnnLinear,
    pack_weight,
    packed_copy_bytes,
    packed_copy_fits,
    set_fp32_linear_path,
    use_default_linear,
    use_onednn_linear,
)
from calispec_core.protocol import model_info_to_pb
from tests.conftest import TinyPair

PROMPT = [5, 17, 42, 8, 99, 3, 250, 61]


def onednn_layers(model: nn.Module) -> int:
    return sum(isinstance(m, OneDnnLinear) for m in model.modules())


@pytest.fixture(scope="module")
def plain_runner(tiny_pair: TinyPair) -> ModelRunner:
    return ModelRunner(ModelSpec(tiny_pair.target, dtype="float32", device="cpu", fp32_linear="default"))


def test_float32_runners_serve_every_linear_layer_through_onednn(target_runner, onednn_runner, plain_runner) -> None:
    linears = sum(type(m) is nn.Linear for m in plain_runner.model.modules())
    for runner in (target_runner, onednn_runner):  # what the services load (auto), and onednn asked for
        assert linears > 0 and onednn_layers(runner.model) == linears
    assert onednn_layers(plain_runner.model) == 0
    assert (onednn_runner.fp32_linear, plain_runner.fp32_linear) == ("onednn", "default")


@pytest.fixture(scope="module")
def packed_runner(tiny_pair: TinyPair) -> ModelRunner:
    return ModelRunner(ModelSpec(tiny_pair.target, dtype="float32", device="cpu", fp32_linear="packed"))


@pytest.fixture(scope="module")
def onednn_runner(tiny_pair: TinyPair) -> ModelRunner:
    return ModelRunner(ModelSpec(tiny_pair.target, dtype="float32", device="cpu", fp32_linear="onednn"))


@torch.inference_mode()
def test_every_forward_runs_on_onednn_one_row_included(onednn_runner: ModelRunner) -> None:
    """One row too: on the AVX2-only EPYC of wave 14 oneDNN streams a row ~1.5x faster than MKL's GEMV."""
    session = prefill_session(onednn_runner, "rows", PROMPT)

    def ops_of(tokens: list[int]) -> set[str]:
        with profile(activities=[ProfilerActivity.CPU]) as prof:  # sees the ops of its own thread
            onednn_runner.forward(tokens, session.cache, len(tokens))
        session.cache.crop(-len(tokens))
        return {event.key for event in prof.key_averages()}

    ops_of = partial(compute_thread().run, ops_of)  # forwards run on the compute thread

    for tokens in ([*session.pending(), 7, 9, 11], session.pending()):
        ops = ops_of(tokens)
        assert "mkldnn::_linear_pointwise" in ops and "aten::addmm" not in ops and "aten::mm" not in ops


@torch.inference_mode()
def test_packed_layers_multiply_several_rows_on_the_packed_weight_and_one_row_on_the_plain_one() -> None:
    torch.manual_seed(0)
    layer = OneDnnLinear(nn.Linear(16, 24))
    layer.set_packed(True)
    x = torch.randn(1, 3, 16)
    expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    layer.packed = pack_weight(torch.zeros_like(layer.weight))  # which weight each product reads
    torch.testing.assert_close(layer(x), layer.bias.expand(1, 3, 24))
    torch.testing.assert_close(layer(x[:, :1]), expected[:, :1], rtol=1e-5, atol=1e-5)
    layer.set_packed(False)
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_packed_runners_pack_every_layer_once_and_onednn_ones_none(onednn_runner, packed_runner) -> None:
    packed = [m for m in packed_runner.model.modules() if isinstance(m, OneDnnLinear)]
    assert packed and all(m.use_packed and m.packed is not None and m.packed.is_mkldnn for m in packed)
    plain = [m for m in onednn_runner.model.modules() if isinstance(m, OneDnnLinear)]
    assert plain and all(not m.use_packed and m.packed is None for m in plain)
    assert set(packed_runner.model.state_dict()) == set(onednn_runner.model.state_dict())  # copies are not state
    assert packed_runner.fp32_linear == "packed" and model_info_to_pb(packed_runner).fp32_linear == "packed"


def test_bf16_layers_count_and_pack_only_when_asked(monkeypatch) -> None:
    """bf16 layers join the oneDNN path only with bf16=True, which ModelRunner passes on CPUs with bf16 units."""
    monkeypatch.setattr(onednn_linear, "available_bytes", lambda: 1 << 40)
    model = nn.Sequential(nn.Linear(16, 32).to(torch.bfloat16))
    assert (packed_copy_bytes(model), packed_copy_bytes(model, bf16=True)) == (0, 16 * 32 * 2)
    assert set_fp32_linear_path(model, "auto") == "" and type(model[0]) is nn.Linear
    swapped = nn.Sequential(OneDnnLinear(nn.Linear(16, 32).to(torch.bfloat16)), OneDnnLinear(nn.Linear(8, 8)))
    assert packed_copy_bytes(swapped) == 8 * 8 * 4  # swapped layers count by their dtype too


@pytest.fixture(scope="module")
def bf16_runners(tiny_pair: TinyPair) -> tuple[ModelRunner, ModelRunner]:
    """The tiny target in bf16 as the services load it (auto) and on torch's own path."""
    spec = partial(ModelSpec, tiny_pair.target, dtype="bfloat16", device="cpu")
    return ModelRunner(spec()), ModelRunner(spec(fp32_linear="default"))


@torch.inference_mode()
def test_bf16_runners_pack_every_layer_where_onednn_runs_bf16(bf16_runners) -> None:
    """Wave 28: on the AVX512-BF16 EPYC a packed bf16 target forward costs 0.70-0.81x torch's, 1 to 7 tokens."""
    served, plain = bf16_runners
    layers = [m for m in served.model.modules() if isinstance(m, OneDnnLinear)]
    if not cpu_has_fast_bf16():  # a CPU without bf16 units (or oneDNN capped below them): torch's own path
        assert served.fp32_linear == "" and not layers
        return
    assert served.fp32_linear == "packed" and layers and onednn_layers(plain.model) == 0
    assert all(m.use_packed and m.packed is not None and m.packed_from_rows == 1 for m in layers)
    for new in ([11], [11, 12, 13, 14, 15, 16, 17]):  # a decode step and a 7-token verify forward
        a_session, b_session = (prefill_session(r, "same", PROMPT) for r in (served, plain))
        a = served.forward(a_session.pending() + new, a_session.cache, len(new) + 1)
        b = plain.forward(b_session.pending() + new, b_session.cache, len(new) + 1)
        assert a.dtype == b.dtype == torch.bfloat16
        torch.testing.assert_close(a.float(), b.float(), rtol=0.05, atol=0.05)  # bf16: another summation order


@pytest.mark.parametrize("bf16_units", [True, False])
def test_bf16_runners_swap_their_layers_only_on_cpus_with_bf16_units(tiny_pair, monkeypatch, bf16_units) -> None:
    """Machine-independent: the runner asks `cpu_has_fast_bf16` (no packing, no forward here)."""
    monkeypatch.setattr(modeling, "cpu_has_fast_bf16", lambda: bf16_units)
    runner = ModelRunner(ModelSpec(tiny_pair.target, dtype="bfloat16", device="cpu", fp32_linear="onednn"))
    layers = [m for m in runner.model.modules() if isinstance(m, OneDnnLinear)]
    linears = sum(type(m) is nn.Linear for m in runner.model.modules())
    if bf16_units:
        assert runner.fp32_linear == "onednn" and layers and linears == 0
        assert all(m.packed_from_rows == 1 and m.weight.dtype == torch.bfloat16 for m in layers)
        assert use_default_linear(runner.model) == len(layers)  # undone like float32 layers
        assert all(m.weight.dtype == torch.bfloat16 for m in runner.model.modules() if type(m) is nn.Linear)
    else:
        assert runner.fp32_linear == "" and not layers and linears > 0


@torch.inference_mode()
def test_packed_from_rows_decides_which_weight_a_product_reads() -> None:
    torch.manual_seed(0)
    layer = OneDnnLinear(nn.Linear(16, 24))
    assert layer.packed_from_rows == 2  # float32: one row on the plain weight
    layer.set_packed(True)
    layer.packed = pack_weight(torch.zeros_like(layer.weight))
    x = torch.randn(1, 1, 16)
    torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    layer.packed_from_rows = 1  # what a bf16 layer has
    torch.testing.assert_close(layer(x), layer.bias.expand(1, 1, 24))


@torch.inference_mode()
def test_a_cast_or_move_packs_the_new_weight_again() -> None:
    """A cast makes a new weight (nn.Module._apply): products must not read the copy packed from the old one."""
    torch.manual_seed(0)
    layer = OneDnnLinear(nn.Linear(16, 24))
    layer.set_packed(True)
    x = torch.randn(1, 3, 16)  # 3 rows: the packed weight's product
    layer._apply(lambda t: t * 2)  # what .to(dtype) does, with a new weight this test can predict
    expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    assert layer.use_packed and layer.packed is not None
    layer.double()  # another dtype: the copy goes, and products take torch's own path
    assert not layer.use_packed and layer.packed is None
    torch.testing.assert_close(layer(x.double()), torch.nn.functional.linear(x.double(), layer.weight, layer.bias))


@torch.inference_mode()
def test_a_bf16_layer_multiplies_one_row_on_the_packed_weight() -> None:
    if not cpu_has_fast_bf16():  # bf16 products on oneDNN need the units; here bf16 layers keep torch's path
        model = nn.Sequential(nn.Linear(32, 48).to(torch.bfloat16))
        assert set_fp32_linear_path(model, "auto", bf16=cpu_has_fast_bf16()) == "" and type(model[0]) is nn.Linear
        return
    torch.manual_seed(0)
    layer = OneDnnLinear(nn.Linear(32, 48).to(torch.bfloat16))
    layer.set_packed(True)
    x = torch.randn(1, 1, 32, dtype=torch.bfloat16)
    expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
    torch.testing.assert_close(layer(x), expected, rtol=0.02, atol=0.02)
    layer.packed = pack_weight(torch.zeros_like(layer.weight))  # which weight the one row reads
    torch.testing.assert_close(layer(x), layer.bias.expand(1, 1, 48))


@pytest.mark.parametrize(
    ("shape", "bias", "strided"),
    [((1, 1, 16), True, False), ((1, 3, 16), True, False), ((2, 16), False, False), ((16,), True, False),
     ((2, 1, 16), True, True), ((1, 5, 16), True, False), ((4, 16), False, True)],
)  # fmt: skip
@torch.inference_mode()
def test_products_of_fewer_rows_than_padded_rows_run_as_that_many(
    monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...], bias: bool, strided: bool
) -> None:
    """The padded product (float32 here, so it runs on any CPU) gives each real row what the padded call
    computed for it, in the input's shape (non-contiguous inputs too); products of padded_rows rows or more
    run as they are."""
    torch.manual_seed(0)
    layer = OneDnnLinear(nn.Linear(16, 24, bias=bias))
    layer.set_packed(True)
    layer.packed_from_rows, layer.padded_rows = 1, 4
    calls: list[tuple[int, torch.Tensor]] = []
    product = onednn_linear._product

    def spy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = product(x, weight, bias)
        calls.append((x.numel() // x.shape[-1], out))
        return out

    monkeypatch.setattr(onednn_linear, "_product", spy)
    x = torch.randn(*shape[:-1], 32)[..., ::2] if strided else torch.randn(*shape)  # [..., 16]
    rows = x.numel() // 16
    y = layer(x)
    assert y.shape == (*shape[:-1], 24)
    assert [n for n, _ in calls] == [max(rows, 4)]
    assert torch.equal(y.reshape(rows, 24), calls[0][1][:rows].reshape(rows, 24))
    torch.testing.assert_close(y, torch.nn.functional.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_large_bf16_layers_pad_their_packed_products_and_others_do_not() -> None:
    """Wave 30 measured the gain on the target's MLP and output layers; its 1536 x 1536 projections lost."""
    side = 1 << 11  # 2048 x 2048 = PADDED_MIN_WEIGHTS values
    large_bf16 = OneDnnLinear(nn.Linear(side, side, bias=False, dtype=torch.bfloat16, device="meta"))
    small_bf16 = OneDnnLinear(nn.Linear(side - 1, side, bias=False, dtype=torch.bfloat16, device="meta"))
    large_fp32 = OneDnnLinear(nn.Linear(side, side, bias=False, device="meta"))
    assert side * side == onednn_linear.PADDED_MIN_WEIGHTS
    assert [m.padded_rows for m in (large_bf16, small_bf16, large_fp32)] == [onednn_linear.PADDED_BF16_ROWS, 0, 0]


def test_auto_packs_where_free_memory_holds_the_copy_twice_over() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 16, bias=False))
    need = packed_copy_bytes(model)
    assert need == (16 * 32 + 32 * 16) * 4
    assert packed_copy_fits(need, 2 * need) and not packed_copy_fits(need, 2 * need - 1)
    assert not packed_copy_fits(need, None)  # unknown (not Linux): no second copy
    nothing = packed_copy_bytes(nn.Sequential(nn.Linear(4, 4).to(torch.bfloat16)))
    assert nothing == 0 and not packed_copy_fits(nothing, 1 << 40)  # nothing to pack


@pytest.mark.parametrize(("available", "expected"), [(1 << 40, "packed"), (1 << 10, "onednn"), (None, "onednn")])
def test_the_auto_path_follows_the_memory_available(monkeypatch, available, expected) -> None:
    monkeypatch.setattr(onednn_linear, "available_bytes", lambda: available)
    model = nn.Sequential(nn.Linear(64, 64))
    assert set_fp32_linear_path(model, "auto") == expected
    assert model[0].use_packed == (expected == "packed")


def test_explicit_paths_ignore_memory_and_other_dtypes_report_none(monkeypatch) -> None:
    monkeypatch.setattr(onednn_linear, "available_bytes", lambda: 0)
    assert set_fp32_linear_path(nn.Sequential(nn.Linear(8, 8)), "packed") == "packed"
    assert set_fp32_linear_path(nn.Sequential(nn.Linear(8, 8)), "onednn") == "onednn"
    plain = nn.Sequential(nn.Linear(8, 8))
    assert set_fp32_linear_path(plain, "default") == "default" and type(plain[0]) is nn.Linear
    assert set_fp32_linear_path(nn.Sequential(nn.Linear(8, 8).to(torch.bfloat16)), "auto") == ""


@pytest.mark.parametrize("runner_name", ["onednn_runner", "packed_runner"])
@torch.inference_mode()
def test_onednn_logits_equal_the_plain_float32_models(runner_name: str, plain_runner, request) -> None:
    runner: ModelRunner = request.getfixturevalue(runner_name)
    for new in ([11], [11, 12, 13, 14, 15, 16, 17]):  # a decode step and a 7-token verify forward
        a_session, b_session = (prefill_session(r, "same", PROMPT) for r in (runner, plain_runner))
        a = runner.forward(a_session.pending() + new, a_session.cache, len(new) + 1)
        b = plain_runner.forward(b_session.pending() + new, b_session.cache, len(new) + 1)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("runner_name", ["onednn_runner", "packed_runner"])
@torch.inference_mode()
def test_greedy_verify_forward_accepts_exactly_the_target_only_greedy_tokens(runner_name: str, request) -> None:
    """Greedy SD is exact when a multi-row verify forward (oneDNN) argmaxes to what one-row steps decode."""
    target_runner: ModelRunner = request.getfixturevalue(runner_name)
    session = prefill_session(target_runner, "ar", PROMPT)
    greedy: list[int] = []
    for _ in range(12):  # target-only decoding, one row per forward
        logits = target_runner.forward(session.pending(), session.cache, 1)
        session.tokens.append(int(logits[0, -1].argmax()))
        greedy.append(session.tokens[-1])
    verify = prefill_session(target_runner, "sd", PROMPT)  # a perfect draft of 11 tokens, verified at once
    rows = target_runner.forward(verify.pending() + greedy[:-1], verify.cache, len(greedy))
    assert rows[0].argmax(dim=-1).tolist() == greedy


def test_swapping_keeps_tied_parameters_and_state_dict_and_undoes_cleanly() -> None:
    embed = nn.Embedding(50, 16)
    model = nn.ModuleDict({"embed": embed, "proj": nn.Linear(16, 16), "head": nn.Linear(16, 50, bias=False)})
    model["head"].weight = embed.weight  # tied, as in Qwen's lm_head
    keys = list(model.state_dict())
    x = torch.randn(1, 5, 16)
    before = model["head"](model["proj"](x)).detach()
    assert use_onednn_linear(model) == 2 and model["head"].weight is embed.weight
    assert list(model.state_dict()) == keys
    torch.testing.assert_close(model["head"](model["proj"](x)), before, rtol=1e-5, atol=1e-5)
    assert use_default_linear(model) == 2 and type(model["head"]) is nn.Linear and model["head"].weight is embed.weight


def test_other_dtypes_keep_their_layers(tiny_pair: TinyPair) -> None:
    bf16 = nn.Linear(8, 8).to(torch.bfloat16)
    assert use_onednn_linear(nn.Sequential(bf16)) == 0  # bf16 layers join only when asked (bf16=True)
    int8 = ModelRunner(ModelSpec(tiny_pair.draft, dtype="int8", device="cpu"))
    assert onednn_layers(int8.model) == 0


def test_an_unknown_linear_path_is_invalid_argument(tiny_pair: TinyPair) -> None:
    with pytest.raises(InvalidArgument, match="fp32_linear"):
        ModelRunner(ModelSpec(tiny_pair.draft, dtype="float32", device="cpu", fp32_linear="fast"))


def test_both_model_services_take_the_linear_path_flag() -> None:
    from draft_service.__main__ import parse_config as draft_config
    from target_service.__main__ import parse_config as target_config

    for parse in (draft_config, target_config):
        assert parse(["--model", "m"])[0].model.fp32_linear == "auto"
        assert parse(["--model", "m", "--fp32-linear", "default"])[0].model.fp32_linear == "default"
        assert parse(["--model", "m", "--fp32-linear", "packed"])[0].model.fp32_linear == "packed"

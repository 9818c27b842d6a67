"""The lean packed pass (calispec_core/lean_decoder.py) computes bitwise what HF's pass through the same
modules computes: logits and the keys and values written into every session's cache, for Llama and
Qwen2 (q/k/v biases), float32 and int8 (q/k/v fused into one fbgemm call, gate/up into another, q and k
rotated together), one row and several."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from calispec_core.batch_forward import forward_rows
from calispec_core.int8_fusion import FusedGateUpMLP, fuse_dynamic_int8
from calispec_core.lean_decoder import LeanDecoder
from calispec_core.modeling import ModelRunner, ModelSpec, prefill_session, quantize_int8
from calispec_core.onednn_linear import use_default_linear, use_onednn_linear
from tests.conftest import TinyPair

PROMPTS = [[5, 6, 7, 8, 9, 10, 11] * 3, [20], [30, 31, 32]]  # different cached lengths, one empty
DRAFTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
SHAPE = {"vocab_size": 384, "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}  # fmt: skip


def _model_dir(tmp: Path, tiny: TinyPair, model: torch.nn.Module) -> Path:
    """A random model with the tiny pair's tokenizer (the runner needs one)."""
    model.save_pretrained(tmp)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tiny.target / name).exists():
            shutil.copy(tiny.target / name, tmp / name)
    return tmp


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_pair: TinyPair) -> Path:
    torch.manual_seed(0)
    if request.param == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**SHAPE))  # q, k, v with biases
    else:
        model = LlamaForCausalLM(LlamaConfig(**SHAPE, attention_bias=False))
    return _model_dir(tmp_path_factory.mktemp(request.param), tiny_pair, model)


def _passes(runner: ModelRunner, lean: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[torch.Tensor], ...]:
    """Logits of a 3-row verify-like pass then a 1-row step, and every cache entry written; checks
    which pass ran (HF's goes through `forward_batch`, the lean one never does)."""
    decoder, hf_calls = runner.decoder, []
    hf_pass = runner.forward_batch
    monkeypatch.setattr(runner, "forward_batch", lambda *a, **k: hf_calls.append(1) or hf_pass(*a, **k))
    runner.decoder = decoder if lean else None
    try:
        sessions = [prefill_session(runner, f"s{i}", p) for i, p in enumerate(PROMPTS)]
        inputs = [s.pending() + d for s, d in zip(sessions, DRAFTS, strict=True)]
        logits = forward_rows(runner, [s.cache for s in sessions], inputs, [len(d) + 1 for d in DRAFTS])
        logits += forward_rows(runner, [sessions[0].cache], [[3, 4]], [2])
        entries = [t for s in sessions for layer in s.cache.layers for t in (layer.keys, layer.values)]
    finally:
        runner.decoder = decoder
        monkeypatch.undo()
    assert bool(hf_calls) is not lean
    return logits, entries


def _assert_lean_equals_hf(runner: ModelRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    lean_logits, lean_cache = _passes(runner, True, monkeypatch)
    hf_logits, hf_cache = _passes(runner, False, monkeypatch)
    assert [x.shape for x in lean_logits] == [(4, 384), (3, 384), (5, 384), (2, 384)]
    assert all(torch.equal(a, b) for a, b in zip(lean_logits, hf_logits, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(lean_cache, hf_cache, strict=True))


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_lean_pass_equals_hf_pass_bitwise(model_dir: Path, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = ModelRunner(ModelSpec(model_dir, dtype=dtype, device="cpu"))
    assert isinstance(runner.decoder, LeanDecoder)
    fused = [(layer.fused_qkv is not None, type(layer.module.mlp) is FusedGateUpMLP) for layer in runner.decoder.layers]
    assert fused == [(dtype == "int8",) * 2] * len(fused)  # int8: q/k/v one call, gate/up one call, every layer
    _assert_lean_equals_hf(runner, monkeypatch)


def test_lean_pass_follows_a_linear_path_switched_after_load(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`bench forward` switches float32 Linear paths on a loaded model: the lean pass must run the switched
    modules (it used to keep q/k/v/o on oneDNN and time a mixed path under the `default` label)."""
    runner = ModelRunner(ModelSpec(model_dir, dtype="float32", device="cpu", fp32_linear="onednn"))
    use_default_linear(runner.model)
    _assert_lean_equals_hf(runner, monkeypatch)
    use_onednn_linear(runner.model)
    _assert_lean_equals_hf(runner, monkeypatch)


def test_the_tiny_pair_takes_the_lean_pass(target_runner: ModelRunner, draft_runner: ModelRunner) -> None:
    assert isinstance(target_runner.decoder, LeanDecoder) and isinstance(draft_runner.decoder, LeanDecoder)


def test_lean_forward_off_and_other_architectures_take_hfs_pass(model_dir: Path) -> None:
    assert ModelRunner(ModelSpec(model_dir, dtype="float32", device="cpu", lean_forward=False)).decoder is None
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE))
    model.config.model_type = "mistral"  # a decoder whose layers it does not know
    assert LeanDecoder.build(model) is None
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE))
    model.model.layers[1].mlp = torch.nn.Identity()  # one layer built differently
    assert LeanDecoder.build(model) is None


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", [(True, True, True), (False, False, False), (True, False, True)])
def test_fused_int8_projections_equal_separate_calls_bitwise(bias: tuple[bool, bool, bool], per_channel: bool) -> None:
    torch.manual_seed(1)
    layers = torch.nn.Sequential(*(torch.nn.Linear(64, n, bias=b) for n, b in zip((64, 16, 16), bias, strict=True)))
    if per_channel:
        qconfig = {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
        projections = tuple(torch.ao.quantization.quantize_dynamic(layers, qconfig, dtype=torch.qint8))
    else:
        projections = tuple(quantize_int8(layers))
    fused = fuse_dynamic_int8(projections)
    assert fused is not None
    for rows in (1, 7, 24):
        x = torch.randn(1, rows, 64) * 3
        assert torch.equal(fused(x), torch.cat([p(x) for p in projections], dim=-1))


def test_int8_model_with_fused_mlps_computes_what_quantize_dynamic_alone_computes(model_dir: Path) -> None:
    """quantize_int8 replaces HF's MLPs by FusedGateUpMLP: the whole model's logits stay the same bits, and
    the separate gate and up weights are gone (not held twice)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    fused = quantize_int8(copy.deepcopy(model))  # sets fbgemm, which the plain quantisation then uses too
    plain = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    mlps = [layer.mlp for layer in fused.model.layers]
    assert all(type(mlp) is FusedGateUpMLP for mlp in mlps) and len(mlps) == SHAPE["num_hidden_layers"]
    assert not any(hasattr(mlp, "gate_proj") or hasattr(mlp, "up_proj") for mlp in mlps)
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    with torch.inference_mode():
        assert torch.equal(fused(input_ids).logits, plain(input_ids).logits)


def test_float_projections_are_not_fused() -> None:
    layers = (torch.nn.Linear(8, 8), torch.nn.Linear(8, 4), torch.nn.Linear(8, 4))
    assert fuse_dynamic_int8(layers) is None

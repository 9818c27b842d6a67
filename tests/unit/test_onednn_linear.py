"""float32 Linear layers on oneDNN (calispec_core/onednn_linear.py): same logits, greedy tokens, parameters."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from calispec_core.compute import compute_thread
from calispec_core.errors import InvalidArgument
from calispec_core.modeling import ModelRunner, ModelSpec, prefill_session
from calispec_core.onednn_linear import OneDnnLinear, use_default_linear, use_onednn_linear
from tests.conftest import TinyPair

PROMPT = [5, 17, 42, 8, 99, 3, 250, 61]


def onednn_layers(model: nn.Module) -> int:
    return sum(isinstance(m, OneDnnLinear) for m in model.modules())


@pytest.fixture(scope="module")
def plain_runner(tiny_pair: TinyPair) -> ModelRunner:
    return ModelRunner(ModelSpec(tiny_pair.target, dtype="float32", device="cpu", fp32_linear="default"))


def test_float32_runners_serve_every_linear_layer_through_onednn(target_runner, plain_runner) -> None:
    linears = sum(type(m) is nn.Linear for m in plain_runner.model.modules())
    assert linears > 0 and onednn_layers(target_runner.model) == linears  # what the services load
    assert onednn_layers(plain_runner.model) == 0


@torch.inference_mode()
def test_multi_row_forwards_run_on_onednn_and_one_row_on_torchs_path(target_runner: ModelRunner) -> None:
    session = prefill_session(target_runner, "rows", PROMPT)

    def ops_of(tokens: list[int]) -> set[str]:
        with profile(activities=[ProfilerActivity.CPU]) as prof:  # sees the ops of its own thread
            target_runner.forward(tokens, session.cache, len(tokens))
        session.cache.crop(-len(tokens))
        return {event.key for event in prof.key_averages()}

    ops_of = partial(compute_thread().run, ops_of)  # forwards run on the compute thread

    assert "mkldnn::_linear_pointwise" in ops_of([*session.pending(), 7, 9, 11])
    assert "mkldnn::_linear_pointwise" not in ops_of(session.pending())


@torch.inference_mode()
def test_onednn_logits_equal_the_plain_float32_models(target_runner, plain_runner) -> None:
    for new in ([11], [11, 12, 13, 14, 15, 16, 17]):  # a decode step and a 7-token verify forward
        a_session, b_session = (prefill_session(r, "same", PROMPT) for r in (target_runner, plain_runner))
        a = target_runner.forward(a_session.pending() + new, a_session.cache, len(new) + 1)
        b = plain_runner.forward(b_session.pending() + new, b_session.cache, len(new) + 1)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_greedy_verify_forward_accepts_exactly_the_target_only_greedy_tokens(target_runner: ModelRunner) -> None:
    """Greedy SD is exact when a multi-row verify forward (oneDNN) argmaxes to what one-row steps decode."""
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
    assert use_onednn_linear(nn.Sequential(bf16)) == 0
    int8 = ModelRunner(ModelSpec(tiny_pair.draft, dtype="int8", device="cpu"))
    assert onednn_layers(int8.model) == 0


def test_an_unknown_linear_path_is_invalid_argument(tiny_pair: TinyPair) -> None:
    with pytest.raises(InvalidArgument, match="fp32_linear"):
        ModelRunner(ModelSpec(tiny_pair.draft, dtype="float32", device="cpu", fp32_linear="fast"))


def test_both_model_services_take_the_linear_path_flag() -> None:
    from draft_service.__main__ import parse_config as draft_config
    from target_service.__main__ import parse_config as target_config

    for parse in (draft_config, target_config):
        assert parse(["--model", "m"])[0].model.fp32_linear == "onednn"
        assert parse(["--model", "m", "--fp32-linear", "default"])[0].model.fp32_linear == "default"

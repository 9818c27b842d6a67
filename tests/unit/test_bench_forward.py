"""`calispec_tools.bench.forward --batch`: the batched path runs and leaves the sessions as they were."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from calispec_core.forward_costs import context_session, forward_ms
from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_core.onednn_linear import PADDED_BF16_ROWS, OneDnnLinear
from calispec_tools.bench import forward
from calispec_tools.bench.forward import measure
from tests.conftest import TinyPair


@pytest.fixture(scope="module")
def own_runner(tiny_pair: TinyPair) -> ModelRunner:
    """Its own model: `measure` switches Linear paths, which must not leak into the shared runners."""
    return ModelRunner(ModelSpec(tiny_pair.target, dtype="float32", device="cpu", fp32_linear="default"))


def test_batched_forward_leaves_every_session_as_it_was(own_runner: ModelRunner) -> None:
    sessions = [context_session(own_runner, 20 + 8 * b, headroom=7) for b in range(3)]
    before = [(s.cached_len, list(s.tokens)) for s in sessions]
    assert forward_ms(own_runner, sessions, 7) > 0
    assert [(s.cached_len, list(s.tokens)) for s in sessions] == before


def test_measure_times_every_token_count_of_a_batch(own_runner: ModelRunner) -> None:
    medians = measure(own_runner, ["default"], [1, 4], reps=1, batch=2)
    assert set(medians) == {("default", 1), ("default", 4)} and all(ms > 0 for ms in medians.values())


def test_measure_compares_the_lean_pass_with_hfs_and_restores_it(own_runner: ModelRunner, monkeypatch) -> None:
    lean = own_runner.decoder
    assert lean is not None
    hf_calls: list[int] = []
    hf_pass = own_runner.forward_batch
    monkeypatch.setattr(own_runner, "forward_batch", lambda *a, **k: hf_calls.append(1) or hf_pass(*a, **k))
    medians = measure(own_runner, ["lean", "hf"], [1, 2], reps=1)
    assert set(medians) == {("lean", 1), ("lean", 2), ("hf", 1), ("hf", 2)} and all(ms > 0 for ms in medians.values())
    assert len(hf_calls) == 2 * 2  # the `hf` variant's forwards only (warm-up + 1 rep, 2 token counts)
    assert own_runner.decoder is lean


def test_the_unpadded_path_undoes_the_bf16_row_padding_and_packed_restores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forward, "use_onednn_linear", lambda model, **_: 0)  # no packing: any CPU
    side = 1 << 11  # a bf16 weight large enough to pad (onednn_linear.PADDED_MIN_WEIGHTS)
    model = nn.Sequential(
        OneDnnLinear(nn.Linear(side, side, dtype=torch.bfloat16, device="meta")),
        OneDnnLinear(nn.Linear(side, side, device="meta")),
    )
    forward.SWITCH["unpadded"](model)
    assert [m.padded_rows for m in model] == [0, 0]
    forward.SWITCH["packed"](model)
    assert [m.padded_rows for m in model] == [PADDED_BF16_ROWS, 0]

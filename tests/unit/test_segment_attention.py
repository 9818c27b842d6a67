"""Teacher forcing's per-document attention (calispec_core/attention.py `segment_attention`): what the block-diagonal
causal mask computes, and the path calibration's forwards take."""

from __future__ import annotations

import random

import pytest
import torch

from calispec_core import attention
from calispec_core.modeling import ModelRunner
from calispec_tools.calibrate.teacher import greedy_predictions


class _Layer(torch.nn.Module):
    is_causal = True
    num_key_value_groups = 2


@pytest.mark.parametrize("widths", [[[7, 1, 12, 4]], [[24]], [[10, 14], [3, 20, 1]]])
def test_per_document_attention_equals_the_block_diagonal_mask(widths: list[list[int]]) -> None:
    generator = torch.Generator().manual_seed(len(widths[0]))
    batch, width = len(widths), sum(widths[0])
    query = torch.randn(batch, 4, width, 8, generator=generator)  # [B, H_q, S, D]
    key, value = (torch.randn(batch, 2, width, 8, generator=generator) for _ in range(2))  # [B, H_kv, S, D]
    document = torch.tensor([[i for i, n in enumerate(row) for _ in range(n)] for row in widths])  # [B, S]
    causal = torch.ones(width, width, dtype=torch.bool).tril()  # [S, S]
    mask = (document[:, :, None] == document[:, None, :]) & causal  # [B, S, S]
    expected, _ = attention.sdpa_attention_forward(_Layer(), query, key, value, mask[:, None], scaling=0.3)
    got, _ = attention.segment_attention(_Layer(), query, key, value, widths, 0.0, 0.3)
    assert got.shape == expected.shape == (batch, width, 4, 8)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_teacher_forcing_runs_attention_per_document(
    target_runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forward gives its documents' widths, padding included, to every layer's attention; the predictions are
    each row's alone (test_calibrate_packing.py checks them against single-row forwards)."""
    seen: list[list[list[int]]] = []
    segment_attention = attention.segment_attention

    def recording(*args: object, **kwargs: object) -> tuple[torch.Tensor, None]:
        seen.append(args[4])
        return segment_attention(*args, **kwargs)

    monkeypatch.setattr(attention, "segment_attention", recording)
    rng = random.Random(3)
    rows = [[rng.randrange(target_runner.vocab_size) for _ in range(n)] for n in (5, 30, 12)]
    greedy_predictions(target_runner, rows, capacity=45)  # two sequences, one forward
    layers = target_runner.model.config.num_hidden_layers
    assert seen == [[[30, 12, 3], [5, 40]]] * layers  # first fit, longest first: [30, 12] and [5], then padding

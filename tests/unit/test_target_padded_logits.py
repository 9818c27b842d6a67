"""The target engine pads each round's logits into one buffer kept from round to round (a fresh tensor of
tens of MB is faulted in page by page every round): the padding is zeros whatever an earlier round left
there, and a bigger round grows the buffer."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from calispec_core.modeling import ModelRunner
from target_service.engine import TargetEngine
from target_service.pair_table import PairTable

VOCAB = 64


def _round(engine: TargetEngine, drafts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the engine's padded logits, the reference: zeros with each row's logits copied in) for rows drafting
    drafts[b] tokens, logits in bf16 as the bf16 target returns them."""
    rows = [SimpleNamespace(draft=[7] * n) for n in drafts]
    logits = [torch.randn(n + 1, VOCAB).to(torch.bfloat16) for n in drafts]  # [G_b + 1, V]
    reference = torch.zeros(len(drafts), max(drafts) + 1, VOCAB)
    for b, row_logits in enumerate(logits):
        reference[b, : len(row_logits)] = row_logits
    return engine._padded_logits(rows, logits, max(drafts)), reference


@pytest.fixture
def engine(target_runner: ModelRunner) -> Iterator[TargetEngine]:
    engine = TargetEngine(target_runner, 4, PairTable(target_runner.vocab_size))
    try:
        yield engine
    finally:
        engine.stop()


def test_rounds_reuse_one_buffer_and_pad_with_zeros(engine: TargetEngine) -> None:
    torch.manual_seed(0)
    first, reference = _round(engine, [4, 4, 4])
    assert torch.equal(first, reference)
    second, reference = _round(engine, [0, 4])  # row 0's padding held the first round's logits
    assert torch.equal(second, reference) and not second[0, 1:].any()
    assert second.data_ptr() == first.data_ptr()  # the same pages, not a fresh tensor
    third, reference = _round(engine, [6, 6, 6, 6])  # bigger than any round before: the buffer grows
    assert torch.equal(third, reference)
    fourth, reference = _round(engine, [1, 2])
    assert torch.equal(fourth, reference) and fourth.data_ptr() == third.data_ptr()


def test_a_lone_row_is_its_own_logits_in_float32(engine: TargetEngine) -> None:
    logits = torch.randn(3, VOCAB)
    padded = engine._padded_logits([SimpleNamespace(draft=[1, 2])], [logits], 2)
    assert padded.shape == (1, 3, VOCAB) and padded.data_ptr() == logits.data_ptr()

"""argmax_last is torch.argmax exactly: ties, NaN, widths that are not a multiple of the block, any shape."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from calispec_core.argmax import BLOCK, MIN_WIDTH, argmax_last

QWEN_VOCAB = 151_936


def _check(x: torch.Tensor) -> None:
    got = argmax_last(x)
    assert got.dtype == torch.int64
    assert torch.equal(got, x.argmax(dim=-1))


def test_real_vocabulary_width_and_batched_shapes() -> None:
    g = torch.Generator().manual_seed(0)
    for shape in [(QWEN_VOCAB,), (1, 1, QWEN_VOCAB), (8, 7, QWEN_VOCAB)]:
        _check(torch.randn(shape, generator=g))


def test_ties_pick_the_first_maximum_across_and_within_blocks() -> None:
    x = torch.zeros(3, 10 * BLOCK)
    x[0, [5 * BLOCK + 3, 2 * BLOCK + 7, 9 * BLOCK]] = 4.0  # across blocks: the earliest block's
    x[1, [BLOCK + 9, BLOCK + 2]] = 4.0  # within one block: the earlier id
    # row 2: all equal: id 0
    assert argmax_last(x).tolist() == [2 * BLOCK + 7, BLOCK + 2, 0]


def test_a_maximum_in_the_short_tail_block() -> None:
    width = 9 * BLOCK + 5
    x = torch.randn(4, width, generator=torch.Generator().manual_seed(1))
    x[0, width - 1] = 50.0  # the very last id
    x[1, 9 * BLOCK] = 50.0  # the tail's first id
    x[2, [9 * BLOCK + 2, width - 1]] = 50.0  # a tie inside the tail
    _check(x)
    assert argmax_last(x)[:3].tolist() == [width - 1, 9 * BLOCK, 9 * BLOCK + 2]


def test_nan_is_the_maximum_as_in_torch() -> None:
    x = torch.randn(2, 12 * BLOCK, generator=torch.Generator().manual_seed(2))
    x[0, [7 * BLOCK + 1, 3 * BLOCK + 4]] = float("nan")
    x[1, 11 * BLOCK + 3] = float("inf")
    _check(x)


def test_other_dtypes_strided_views_and_narrow_rows() -> None:
    g = torch.Generator().manual_seed(3)
    _check(torch.randn(5, QWEN_VOCAB, generator=g).bfloat16())  # the blocked path
    _check(torch.randn(5, QWEN_VOCAB, generator=g).half())
    _check(torch.randn(5, QWEN_VOCAB, generator=g).double())
    _check(torch.randn(3, 5, QWEN_VOCAB, generator=g)[:, 1:4])  # a non-contiguous view
    _check(torch.randn(5, MIN_WIDTH - 1, generator=g))  # torch.argmax path


def test_nan_in_bf16_as_in_torch() -> None:
    x = torch.randn(2, 12 * BLOCK, generator=torch.Generator().manual_seed(4)).bfloat16()
    x[0, [7 * BLOCK + 1, 3 * BLOCK + 4]] = float("nan")
    _check(x)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 4),
    width=st.integers(MIN_WIDTH, 3 * MIN_WIDTH),
    levels=st.integers(1, 6),  # few distinct values: many ties
    seed=st.integers(0, 2**31 - 1),
)
def test_equals_torch_argmax(rows: int, width: int, levels: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(levels, (rows, width), generator=g).float()
    _check(x)
    _check(x.bfloat16())

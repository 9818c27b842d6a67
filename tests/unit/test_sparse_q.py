"""Sparse draft distributions: what the draft keeps of q, and densifying it on the target."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calispec_core.errors import InvalidArgument
from calispec_core.sparse_q import SparseQ, truncate


def test_a_q_with_a_small_support_is_kept_exactly() -> None:
    q = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])  # e.g. after top-k 3
    ids, probs = truncate(q, k=4)
    assert sorted(ids.tolist()) == [1, 3, 4]
    assert torch.equal(torch.zeros(6).index_put_((ids,), probs), q)


def test_a_wide_q_keeps_its_k_most_likely_tokens_renormalised() -> None:
    q = torch.tensor([0.1, 0.4, 0.2, 0.3])
    ids, probs = truncate(q, k=2)
    assert ids.tolist() == [1, 3]
    torch.testing.assert_close(probs, torch.tensor([0.4, 0.3]) / 0.7)


def test_densify_puts_each_row_where_it_belongs() -> None:
    q = SparseQ.of_rows([(torch.tensor([2, 0]), torch.tensor([0.75, 0.25])), (torch.tensor([1]), torch.tensor([1.0]))])
    dense = q.validate(rows=2, vocab_size=3).densify(3, "cpu")
    assert dense.tolist() == [[0.25, 0.0, 0.75], [0.0, 1.0, 0.0]]


def test_the_same_token_in_two_rows_is_fine_twice_in_one_row_is_not() -> None:
    ids, probs = np.array([4, 4]), np.array([1.0, 1.0], dtype=np.float32)
    SparseQ([1, 1], ids, probs).validate(rows=2, vocab_size=5)
    with pytest.raises(InvalidArgument, match="more than once"):
        SparseQ([2], ids, probs / 2).validate(rows=1, vocab_size=5)

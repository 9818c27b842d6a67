"""SparseQ.validate with the draft tokens: each drafted token needs q > 0 in its own row (the draft sampled it)."""

from __future__ import annotations

import numpy as np
import pytest

from calispec_core.errors import InvalidArgument
from calispec_core.sparse_q import SparseQ

Q = SparseQ([2, 2], np.array([4, 1, 1, 3]), np.array([0.5, 0.5, 1.0, 0.0], dtype=np.float32))


def test_each_drafted_token_listed_with_mass_in_its_own_row_passes() -> None:
    Q.validate(rows=2, vocab_size=5, draft=[1, 1])


@pytest.mark.parametrize(
    ("draft", "position"),
    [([4, 4], 1), ([2, 1], 0), ([1, 3], 1)],  # only in another row; in none; listed with q = 0
)
def test_a_drafted_token_with_q_0_is_refused_naming_its_position(draft: list[int], position: int) -> None:
    with pytest.raises(InvalidArgument, match=f"draft token {position} \\(id {draft[position]}\\) has probability 0"):
        Q.validate(rows=2, vocab_size=5, draft=draft)

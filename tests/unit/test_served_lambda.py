"""The one rule by which `calispec up` and `calispec ray up` serve the λ chosen for a seeded calibration."""

from __future__ import annotations

import pytest

from calispec_tools.shipped_calibration import served_lambda

CHOICES = {"float32": 3}


@pytest.mark.parametrize(
    ("dtype", "seeded", "guard", "papers_tau", "expected"),
    [
        ("float32", True, True, True, 3),
        ("bfloat16", True, True, True, None),  # no λ was chosen on this dtype
        (None, True, True, True, None),  # the target's dtype is not known
        ("float32", False, True, True, None),  # the file is not in the memory
        ("float32", True, False, True, None),  # λ was chosen for the guarded rule
        ("float32", True, True, False, None),  # ... and at the paper's τ
    ],
)
def test_the_chosen_lambda_is_served_only_where_it_was_chosen(
    dtype: str | None, seeded: bool, guard: bool, papers_tau: bool, expected: int | None
) -> None:
    assert served_lambda(CHOICES, dtype, seeded=seeded, meaning_guard=guard, papers_tau=papers_tau) == expected

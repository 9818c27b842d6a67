"""A calibration counts the pairs of the draft as it will be served (int8 on CPU), not of a bf16 copy."""

from __future__ import annotations

import argparse

from calispec_tools.cli import served_draft_dtype


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**({"draft_dtype": None, "dtype": "auto", "device": "cpu"} | kw))


def test_calibration_uses_the_served_draft_dtype_on_cpu() -> None:
    assert served_draft_dtype(_args()) == "int8"


def test_explicit_draft_dtype_wins() -> None:
    assert served_draft_dtype(_args(draft_dtype="bfloat16")) == "bfloat16"
    assert served_draft_dtype(_args(draft_dtype="float32")) == "float32"


def test_on_cuda_the_draft_follows_dtype() -> None:
    assert served_draft_dtype(_args(device="cuda", dtype="bfloat16")) == "bfloat16"

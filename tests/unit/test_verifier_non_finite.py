"""verify() flags rows whose target logits hold NaN or inf (damaged weights, a float16 overflow): such rows used to
emit noise (greedy: token 0, an empty completion; sampling: an id one past the vocabulary, INTERNAL)."""

from __future__ import annotations

import pytest
import torch

from target_service import verifier
from target_service.verifier import Mode, VerifyInput, verify

VOCAB = 1200  # wider than argmax.MIN_WIDTH: the CPU fast paths run too
GAMMA = 2
NAN, INF = float("nan"), float("inf")


def _no_counts(draft: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(draft)


def _batch(temperatures: list[float], width: int = VOCAB, dtype: torch.dtype = torch.float32) -> VerifyInput:
    """Row 0 honest; row 1 a NaN at the bonus; row 2 one +inf (float16 overflow); row 3 all -inf at position 0."""
    logits = torch.randn(4, GAMMA + 1, width, generator=torch.Generator().manual_seed(0))  # [B, G+1, V]
    logits[1, GAMMA, 7] = NAN
    logits[2, 1, 3] = INF
    logits[3, 0] = -INF
    rows = len(temperatures)
    return VerifyInput(
        target_logits=logits[:rows].to(dtype),
        draft_tokens=torch.tensor([[1, 2]] * rows),
        num_draft=torch.full((rows,), GAMMA),
        draft_probs=torch.full((rows, GAMMA, width), 1.0 / width),
        temperature=torch.tensor(temperatures),
        top_k=torch.zeros(rows, dtype=torch.int64),
        top_p=torch.zeros(rows),
        mode=torch.full((rows,), int(Mode.CSD)),
        log_tau=torch.full((rows,), -2.0),
        lambda_=torch.zeros(rows, dtype=torch.int64),
        generators=[torch.Generator().manual_seed(b) for b in range(rows)],
    )


@pytest.mark.parametrize(
    "temperatures",
    [[0.0] * 4, [1.0] * 4, [0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 1.0, 0.0]],
    ids=["greedy", "sampling", "mixed", "mixed-other-way"],
)
@pytest.mark.parametrize("width", [VOCAB, 64], ids=["wide", "narrow"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("gpu_sums", [False, True], ids=["cpu-sums", "gpu-sums"])
def test_rows_with_nan_or_inf_logits_are_flagged(
    temperatures: list[float], width: int, dtype: torch.dtype, gpu_sums: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpu-sums: the inverse CDF flattened as on a GPU, which first turned a NaN row's sums to 0 and let it pass
    (found by review)."""
    monkeypatch.setattr(verifier, "flattens", lambda device: gpu_sums)
    out = verify(_batch(temperatures, width, dtype), _no_counts)
    assert out.finite.tolist() == [True, False, False, False]


def test_a_batch_of_honest_rows_is_all_finite() -> None:
    out = verify(_batch([1.0], VOCAB), _no_counts)
    assert out.finite.tolist() == [True]
    assert verify(_batch([0.0], VOCAB), _no_counts).finite.tolist() == [True]

"""Wave 46, on d5cee3c (reverted in dd41ee3, so it no longer runs at HEAD): teacher forcing's attention per document
(`segment_attention`) against the block-diagonal mask it replaced, interleaved in one process (this VM's speed drifts
by a third between minutes), for both served models over the shipped corpus's text, with calibration's heap and the
int8 draft's GEMM path of this wave.

`.venv/bin/python -W ignore docs/measurements/wave46-amx/teacher_attention.py [repeats]` (alone). Prints each pass's
seconds and a digest of its predictions per variant and model.
"""

import sys
import time
from pathlib import Path

import torch

from calispec_core import attention
from calispec_core.limits import INT8_SPLIT
from calispec_tools.bench.calibration import text_documents
from calispec_tools.calibrate import teacher
from calispec_tools.calibrate.corpus import encode, windows
from calispec_tools.calibrate.job import load_pair

MODELS = Path.home() / ".cache/calispec/models/qwen-coder"
PER_DOCUMENT = attention.segment_attention


def under_the_mask(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    segments: list[list[int]],
    dropout: float,
    scaling: float | None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """What teacher forcing ran before: one SDPA call over each whole sequence under its block-diagonal mask."""
    document = torch.tensor([[i for i, n in enumerate(row) for _ in range(n)] for row in segments])  # [B, S]
    width = document.shape[1]
    mask = (document[:, :, None] == document[:, None, :]) & torch.ones(width, width, dtype=torch.bool).tril()
    return attention.sdpa_attention_forward(
        module, query, key, value, mask[:, None], dropout=dropout, scaling=scaling, **kwargs
    )


def main(repeats: int) -> None:
    draft, target = load_pair(MODELS / "draft", MODELS / "target", "auto", "auto", "int8", INT8_SPLIT)
    rows = [w for d in text_documents() for w in windows(encode(target.tokenizer, d.text), 512)]
    print(f"threads {torch.get_num_threads()}, {len(rows)} rows, {sum(map(len, rows))} tokens")
    for _ in range(repeats):
        for variant, function in (("mask", under_the_mask), ("per-document", PER_DOCUMENT)):
            attention.segment_attention = function
            for name, runner in (("draft int8", draft), ("target bf16", target)):
                start = time.perf_counter()
                predictions = teacher.greedy_predictions(runner, rows, 512)
                seconds = time.perf_counter() - start
                digest = hash(tuple(tuple(p) for p in predictions))
                print(f"{variant:12s} {name:11s} {seconds:5.1f} s  digest {digest}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)

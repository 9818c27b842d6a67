"""The draft's largest |input| into each Linear layer: a text's first token against the other tokens.

`PYTHONPATH=. .venv/bin/python docs/measurements/wave40-amx/first_token_peaks.py [MODEL_DIR]` (default: the pulled
qwen-coder draft), float32, over the first 256 tokens of README.md; prints the 12 layers where the first token's
peak stands furthest above the others'. Why it matters: a dynamic int8 Linear quantises all rows of a call with one
scale (calispec_core/int8_outliers.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

MODEL = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.home() / ".cache/calispec/models/qwen-coder/draft"


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(MODEL, local_files_only=True)
    ids = tokenizer(Path("README.md").read_text()[:20000], return_tensors="pt").input_ids[:, :256]  # [1, 256]
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32, local_files_only=True).eval()
    peaks: list[tuple[str, float, float, float]] = []

    def record(name: str) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
            rows = inputs[0][0].abs().amax(dim=-1)  # [T] each token's largest |input|
            peaks.append((name, rows[0].item(), rows[1:].max().item(), rows[1:].median().item()))

        return hook

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(record(name))
    with torch.inference_mode():
        model(ids)
    peaks.sort(key=lambda p: -p[1] / max(p[2], 1e-6))
    print(f"{MODEL.name}: {ids.shape[1]} tokens of README.md, float32; largest |input| per Linear layer")
    print(f"{'layer':40s} {'first token':>11s} {'others: max':>11s} {'median':>7s}")
    for name, first, others, median in peaks[:12]:
        print(f"{name:40s} {first:11.1f} {others:11.1f} {median:7.2f}")


if __name__ == "__main__":
    main()

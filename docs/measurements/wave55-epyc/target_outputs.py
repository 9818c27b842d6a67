"""The target's own greedy outputs of `bench compare`'s four prompts (96 tokens, bf16, 2 threads): the text a
prompt-lookup (n-gram) drafter would draft from. Scratch for wave 55 (docs/waves.md); writes target-outputs.json.

    .venv/bin/python docs/measurements/wave55-epyc/target_outputs.py
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from calispec_tools.bench.pair import PROMPTS
from calispec_tools.models.registry import PAIRS, chat_prompt

TARGET = Path.home() / ".cache/calispec/models/qwen-coder/target"
OUT = Path(__file__).with_name("target-outputs.json")


def main() -> None:
    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(TARGET)
    model = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.bfloat16).eval()
    outputs = []
    for kind, prompts in PROMPTS.items():
        for prompt in prompts:
            ids = tokenizer(chat_prompt(PAIRS["qwen-coder"], prompt), return_tensors="pt").input_ids
            generated = model.generate(ids, max_new_tokens=96, do_sample=False)
            outputs.append((kind, ids[0].tolist(), generated[0, ids.shape[1] :].tolist()))
    OUT.write_text(json.dumps(outputs))


if __name__ == "__main__":
    main()

"""The shipped pair in float32, in process: whether greedy `sd` writes `ar`'s tokens under the benchmark's rules.

`.venv/bin/python docs/measurements/wave60-epyc/fp32_check.py TOKENS [PAIR_DIR]` (PAIR_DIR: the pulled pair,
~/.cache/calispec/models/qwen-coder by default); prints where the outputs first differ, if they do.
"""

import os
import sys
import time

import torch

from calispec_core.generation import GenerationParams, Mode
from calispec_core.logit_rules import LogitRules
from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Deadline
from calispec_tools.inprocess import InProcessTarget, in_process_orchestrator

RULES = LogitRules.of(repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.3)
PROMPTS = [
    "Explain in a short paragraph why the sky is blue.",
    "Write a JavaScript function that removes duplicate values from an array.",
]


def generate(draft: ModelRunner, target: ModelRunner, text: str, mode: Mode, rules, tokens: int) -> list[int]:
    backend = InProcessTarget(target)
    gamma = None if mode == Mode.AR else 4
    params = GenerationParams(tokens, SamplingConfig(), (), gamma, mode, 0.01, 6, rules=rules)
    try:
        chunks = list(in_process_orchestrator(draft, backend).generate(text, params, Deadline(900)))
    finally:
        backend.stop()
    return [t for c in chunks for t in c.token_ids]


def main() -> None:
    torch.set_num_threads(2)
    tokens = int(sys.argv[1])
    pair = sys.argv[2] if len(sys.argv) > 2 else os.path.expanduser("~/.cache/calispec/models/qwen-coder")
    target = ModelRunner(ModelSpec(f"{pair}/target", dtype="float32", device="cpu"))
    draft = ModelRunner(ModelSpec(f"{pair}/draft", dtype="float32", device="cpu"))
    tokenizer = target.tokenizer
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        for rules in (RULES, None):
            out = {}
            for mode in (Mode.AR, Mode.SD):
                start = time.time()
                out[mode] = generate(draft, target, text, mode, rules, tokens)
                kind = "rules" if rules else "free"
                print(prompt[:20], kind, mode.name, len(out[mode]), f"{time.time() - start:.0f}s", flush=True)
            ar, sd = out[Mode.AR], out[Mode.SD]
            first = next((i for i, (x, y) in enumerate(zip(ar, sd, strict=False)) if x != y), min(len(ar), len(sd)))
            print("  equal" if ar == sd else f"  DIFFER at token {first}", flush=True)


if __name__ == "__main__":
    main()

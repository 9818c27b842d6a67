"""How often the int8 draft's greedy token equals the target's, decoding after its own prefill: split vs shared.

`PYTHONPATH=. .venv/bin/python docs/measurements/wave40-amx/draft_agreement.py [PAIR_DIR]` (default: the pulled
qwen-coder pair). For the first 4 prompts of each shipped prompt set (chat template), the target (dtype auto, the
served one) writes 48 greedy tokens; then each draft runner (`--int8-outliers split` and `shared`, the services'
ModelRunner and prefill) prefills the prompt and is fed those tokens one at a time, and every step's argmax is
compared with the target's next token: the rate a greedy proposal would match, the drafts' step time beside it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from calispec_core.modeling import ModelRunner, ModelSpec, prefill_session

PAIR = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.home() / ".cache/calispec/models/qwen-coder"
PROMPTS = Path("calispec_tools/data/prompts")
NEW_TOKENS = 48


def chat_prompts(runner: ModelRunner) -> list[list[int]]:
    prompts = []
    for kind in ("code", "math", "prose"):
        for line in (PROMPTS / f"{kind}.jsonl").read_text().splitlines()[:4]:
            turn = [{"role": "user", "content": json.loads(line)["prompt"]}]
            text = runner.tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
            prompts.append(runner.tokenizer(text).input_ids)
    return prompts


def greedy(runner: ModelRunner, prompt: list[int], name: str) -> list[int]:
    session = prefill_session(runner, name, prompt)
    out, last = [], prompt[-1]
    for _ in range(NEW_TOKENS):
        last = int(runner.forward([last], session.cache, 1)[0, -1].argmax())
        out.append(last)
    return out


def main() -> None:
    drafts = {o: ModelRunner(ModelSpec(PAIR / "draft", "int8", "cpu", 2, int8_outliers=o)) for o in ("split", "shared")}
    target = ModelRunner(ModelSpec(PAIR / "target", "auto", "cpu", 2))
    agree = dict.fromkeys(drafts, 0)
    seconds = dict.fromkeys(drafts, 0.0)
    total = 0
    for i, prompt in enumerate(chat_prompts(target)):
        continuation = greedy(target, prompt, f"target-{i}")
        for outliers, draft in drafts.items():
            session = prefill_session(draft, f"{outliers}-{i}", prompt)
            start = time.perf_counter()
            for fed, wanted in zip([prompt[-1], *continuation[:-1]], continuation, strict=True):
                agree[outliers] += int(draft.forward([fed], session.cache, 1)[0, -1].argmax()) == wanted
            seconds[outliers] += time.perf_counter() - start
        total += len(continuation)
        print(f"prompt {i:2d} ({len(prompt)} tokens): " + ", ".join(f"{o} {n}/{total}" for o, n in agree.items()))
    print(f"target {target.dtype_name}, draft int8, 2 threads; {total} target tokens")
    for outliers in drafts:
        print(f"{outliers:7s} agreement {agree[outliers] / total:.1%}, {seconds[outliers] / total * 1e3:.1f} ms a step")


if __name__ == "__main__":
    main()

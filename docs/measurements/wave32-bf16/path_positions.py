"""Scratch (wave 32, docs/performance.md "Where a proposal stops"): per position of the bf16 target's greedy output,
whether the int8 draft's argmax matches it and the draft's probability of its argmax (its early-stop confidence), the
draft fed one token a call as in serving.

`python path_positions.py OUT.json` (bench compare's four prompts) or `python path_positions.py OUT.json heldout`
(the first four of each shipped prompt set); writes per prompt a list of [match, p(argmax), p(target token)]."""

import json
import sys
from pathlib import Path

import torch

from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_tools.bench.pair import PROMPTS
from calispec_tools.models.registry import PAIRS, chat_prompt

root = Path.home() / ".cache/calispec/models/qwen-coder"
target = ModelRunner(ModelSpec(root / "target"))
draft = ModelRunner(ModelSpec(root / "draft", dtype="int8"))
if sys.argv[2:] == ["heldout"]:
    sets = Path("calispec_tools/data/prompts")
    texts = [
        json.loads(line)["prompt"]
        for k in ("code", "math", "prose")
        for line in (sets / f"{k}.jsonl").read_text().splitlines()[:4]
    ]
else:
    texts = [t for ts in PROMPTS.values() for t in ts]
texts = [chat_prompt(PAIRS["qwen-coder"], t) for t in texts]
out = []
for text in texts:
    ids = target.tokenizer(text)["input_ids"]
    cache = target.new_cache()
    logits = target.forward(ids, cache, 1)
    continuation: list[int] = []
    for _ in range(96):
        token = int(logits[0, -1].float().argmax())
        continuation.append(token)
        if token in target.eos_token_ids:
            break
        logits = target.forward([token], cache, 1)
    draft_cache = draft.new_cache()
    draft_logits = draft.forward(ids, draft_cache, 1)
    rows = []
    for token in continuation:
        p = torch.softmax(draft_logits[0, -1].float(), -1)
        guess = int(p.argmax())
        rows.append((int(guess == token), float(p[guess]), float(p[token])))
        draft_logits = draft.forward([token], draft_cache, 1)
    out.append(rows)
    print(len(continuation), sum(r[0] for r in rows) / len(rows), flush=True)
Path(sys.argv[1]).write_text(json.dumps(out))

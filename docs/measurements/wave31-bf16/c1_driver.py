"""Scratch (wave 31): `python c1_driver.py ADDRESS ar,csd,sd,csd N`: one `bench compare` load level per mode at
concurrency 1 (N requests x 96 tokens of its four prompts) through a running coordinator."""

import sys

from calispec_tools.bench.compare import CompareConfig, load_level
from calispec_tools.bench.pair import PROMPTS
from calispec_tools.models.registry import PAIRS, chat_prompt

texts = [t for ts in PROMPTS.values() for t in ts]
texts = [chat_prompt(PAIRS["qwen-coder"], texts[i % len(texts)]) for i in range(4)]
for mode in sys.argv[2].split(","):
    config = CompareConfig(texts, 96, None, [1], int(sys.argv[3]))
    r = load_level(sys.argv[1], mode, 1, config)
    print(f"{mode} {r['tokens_per_s']:.2f} tok/s acc {r['acceptance']:.3f}", flush=True)

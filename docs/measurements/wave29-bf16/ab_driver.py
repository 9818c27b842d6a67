"""Scratch A/B driver of wave 29 (docs/performance.md, "Concurrency 8 on the bf16 CPU after packing").

`REQS=32 python ab_driver.py ADDR_A ADDR_B A:ar,A:sd,B:sd,B:sd:2,...`: one `bench compare` load level per item
(`REQS` requests × 96 tokens of its four prompts over 8 clients) through coordinator A or B, `mode[:γ]`.
"""

from __future__ import annotations

import os
import sys

from calispec_tools.bench.compare import CompareConfig, load_level
from calispec_tools.bench.pair import PROMPTS
from calispec_tools.models.registry import PAIRS, chat_prompt


def main() -> None:
    texts = [t for ts in PROMPTS.values() for t in ts]
    texts = [chat_prompt(PAIRS["qwen-coder"], texts[i % len(texts)]) for i in range(4)]
    addresses = {"A": sys.argv[1], "B": sys.argv[2]}
    for spec in sys.argv[3].split(","):
        who, mode, *gamma = spec.split(":")
        config = CompareConfig(texts, 96, int(gamma[0]) if gamma else None, [8], int(os.environ.get("REQS", "16")))
        r = load_level(addresses[who], mode, 8, config)
        print(
            f"{spec} {r['tokens_per_s']:.2f} tok/s, full {r['full_concurrency_tokens_per_s']:.2f}, "
            f"acc {r['acceptance']:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""Scratch A/B at concurrency 8 on one stack (bench compare's): adaptive γ against fixed γ, levels alternating.

Run: `.venv/bin/python docs/measurements/wave58-epyc/c8-gamma/ab_gamma.py 3` (3 repeats) -> ab.txt, /tmp/w58/ab/ab.json.
"""

import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import calispec_tools.bench.compare as cmp
from calispec_tools.cli import main

VARIANTS = [(m, g) for m in ("ar", "sd", "csd") for g in ((None,) if m == "ar" else (None, 2, 3))]
REPEATS = int(sys.argv.pop(1)) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 3
results: dict = {}


def ab(address, config):
    for repeat in range(REPEATS):
        order = VARIANTS[repeat % len(VARIANTS) :] + VARIANTS[: repeat % len(VARIANTS)]
        for mode, gamma in order:
            c = dataclasses.replace(config, gamma=gamma)
            r = cmp.load_level(address, mode, 8, c)
            key = f"{mode}-{gamma or 'adaptive'}"
            results.setdefault(key, []).append(r)
            print(
                f"{time.strftime('%H:%M:%S')} repeat {repeat + 1} {key:14s} {r['tokens_per_s']:.2f} tok/s "
                f"acc {r['acceptance']:.3f} tokens {r['tokens']}",
                flush=True,
            )
    print("summary (tok/s per repeat, median ratio to the same repeat's ar):")
    ar = [r["tokens_per_s"] for r in results["ar-adaptive"]]
    for key, rows in results.items():
        tps = [r["tokens_per_s"] for r in rows]
        ratios = [t / a for t, a in zip(tps, ar, strict=True)]
        print(
            f"  {key:14s} {' '.join(f'{t:6.2f}' for t in tps)}  x ar {' '.join(f'{x:.2f}' for x in ratios)}"
            f"  median {statistics.median(ratios):.2f}",
            flush=True,
        )
    Path("/tmp/w58/ab/ab.json").write_text(json.dumps(results, indent=1, default=str))
    raise SystemExit(0)


cmp.run_interleaved = lambda *a, **k: []
cmp.run_load = ab
sys.exit(main(["bench", "compare", "--pair", "qwen-coder", "--prompts", "4", "--max-new-tokens", "96",
               "--concurrency", "8", "--load-requests", "24", "--skip-hf"]))  # fmt: skip

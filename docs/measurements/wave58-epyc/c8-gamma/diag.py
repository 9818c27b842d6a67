"""Scratch: per-request stats of `sd` at concurrency 8, adaptive against fixed γ, on one stack (bench compare's).

Run: `.venv/bin/python docs/measurements/wave58-epyc/c8-gamma/diag.py` -> diag.txt. Its last column ("ovh") sums
each request's round_overhead_ms times its rounds over the rounds: not a per-round figure, ignore it.
"""

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import calispec_tools.bench.compare as cmp
from calispec.client import CalispecClient
from calispec_tools.bench.compare import own_stack_auth
from calispec_tools.cli import main

VARIANTS = [("sd", None), ("sd", 2), ("sd", 3)]
out = {}


def level(address, mode, gamma, config):
    prompts = [config.prompts[i % len(config.prompts)] for i in range(24)]
    with CalispecClient(address, timeout=900, **own_stack_auth()) as client:
        start = time.perf_counter()

        def one(p):
            stats, n = None, 0
            kwargs = {"mode": mode, "max_new_tokens": config.max_new_tokens}
            for chunk in client.generate_stream(p, num_speculative_tokens=gamma, timeout=900, **kwargs):
                n += len(chunk.token_ids)
                stats = chunk.stats or stats
            return n, stats.to_dict()

        with ThreadPoolExecutor(8) as pool:
            rows = list(pool.map(one, prompts))
        secs = time.perf_counter() - start
    return secs, rows


def diag(address, config):
    for repeat in range(2):
        for mode, gamma in VARIANTS[repeat:] + VARIANTS[:repeat]:
            secs, rows = level(address, mode, gamma, config)
            tokens = sum(n for n, _ in rows)

            def s(k, rows=rows):
                return sum(r[k] for _, r in rows)

            rounds = s("rounds")
            mean_gamma = sum(r["mean_gamma"] * r["rounds"] for _, r in rows) / rounds
            ovh = sum(r["round_overhead_ms"] * r["rounds"] for _, r in rows) / rounds
            print(
                f"{time.strftime('%H:%M:%S')} {mode}-{gamma or 'adaptive'}: {tokens / secs:.2f} tok/s, "
                f"rounds {rounds}, target-only {s('target_only_rounds')}, drafted {s('drafted')}, "
                f"accepted {s('accepted')}, mean γ (per round) {mean_gamma:.2f}, "
                f"draft_ms {s('draft_ms') / rounds:.1f}/rnd "
                f"target_ms {s('target_ms') / rounds:.1f}/rnd total_ms {s('total_ms') / rounds:.1f}/rnd ovh {ovh:.1f}",
                flush=True,
            )
            out.setdefault(f"{mode}-{gamma}", []).append({"secs": secs, "rows": rows})
    Path("/tmp/w58/ab/diag.json").write_text(json.dumps(out))
    raise SystemExit(0)


cmp.run_interleaved = lambda *a, **k: []
cmp.run_load = diag
sys.exit(main(["bench", "compare", "--pair", "qwen-coder", "--prompts", "4", "--max-new-tokens", "96",
               "--concurrency", "8", "--skip-hf"]))  # fmt: skip

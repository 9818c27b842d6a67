"""Scratch (wave 32, docs/performance.md "Where a proposal stops"): greedy SD rounds replayed from path_positions.py's
output under early-stop rules, with the costs of wave 31's concurrency-1 trace; prints each rule's speed against `ar`
(over all prompts, then per prompt). A model, not a measurement.

`python path_sim.py positions-bench.json > sim-bench.txt`"""

import json
import sys
from pathlib import Path

DRAFT_MS, TARGET_MS, PER_TOKEN_MS, OVH_DRAFT, OVH_AR = 24.0, 117.6, 1.2, 6.7, 2.7
data = json.loads(Path(sys.argv[1]).read_text())


def run(rows, gmax, stop, draft_ms):
    """Tokens/s of one prompt's greedy SD: each round drafts until `stop` or gmax, keeps the matching prefix."""
    p, t_ms = 0, 0.0
    while p < len(rows):
        k, path = 0, 1.0
        while k < gmax and p + k < len(rows):
            confidence = rows[p + k][1]
            k += 1
            path *= confidence
            if stop(confidence, path):
                break
        accepted = 0
        while accepted < k and rows[p + accepted][0]:
            accepted += 1
        p += accepted + 1
        t_ms += k * draft_ms + TARGET_MS + PER_TOKEN_MS * k + (OVH_DRAFT if k else OVH_AR)
    return len(rows) / t_ms * 1e3


def report(name, gmax, stop, draft_ms=DRAFT_MS):
    rates = [run(r, gmax, stop, draft_ms) for r in data]
    ar = 1e3 / (TARGET_MS + OVH_AR)
    total = sum(len(r) for r in data) / sum(len(r) / x for r, x in zip(data, rates, strict=True))
    print(f"{name:28s} gmax {gmax:2d}: {total / ar:.3f}x ar | per prompt " + " ".join(f"{x / ar:.2f}" for x in rates))


for gmax in (6, 10, 16):
    report("no early stop", gmax, lambda c, path: False)
    for th in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
        report(f"token conf < {th}", gmax, lambda c, path, th=th: c < th)
    for th in (0.2, 0.3, 0.4, 0.5, 0.6):
        report(f"path < {th}", gmax, lambda c, path, th=th: path < th)
print("--- draft step 16 / 32 ms")
for ms in (16.0, 32.0):
    report(f"d{ms:.0f} token conf < 0.4", 10, lambda c, path: c < 0.4, ms)
    for th in (0.3, 0.4, 0.5, 0.6):
        report(f"d{ms:.0f} path < {th}", 10, lambda c, path, th=th: path < th, ms)

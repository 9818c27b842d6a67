"""Prompt-lookup (n-gram) drafting simulated on the target's own greedy outputs (target_outputs.py): per round, the
tokens after the latest earlier match of the last n tokens (n from the longest down), accepted while they equal
the target's; a round emits the accepted tokens and one more. Scratch for wave 55 (docs/waves.md).

    .venv/bin/python docs/measurements/wave55-epyc/prompt_lookup.py > docs/measurements/wave55-epyc/prompt-lookup.txt
"""

from __future__ import annotations

import json
from pathlib import Path

OUTPUTS = Path(__file__).with_name("target-outputs.json")
SETTINGS = [(4, 1, 6), (4, 2, 6), (3, 2, 4), (4, 3, 6), (5, 2, 10)]  # (longest n, shortest n, tokens drafted)


def propose(seq: list[int], longest: int, shortest: int, k: int) -> list[int]:
    for n in range(longest, shortest - 1, -1):
        if len(seq) < n + 1:
            continue
        tail = seq[-n:]
        for start in range(len(seq) - n - 1, -1, -1):  # the latest earlier match
            if seq[start : start + n] == tail:
                return seq[start + n : start + n + k]
    return []


def main() -> None:
    outputs = json.loads(OUTPUTS.read_text())
    for longest, shortest, k in SETTINGS:
        rounds = emitted = drafting = drafted = accepted = 0
        for _, prompt, out in outputs:
            at = 0
            while at < len(out):
                proposal = propose(prompt + out[:at], longest, shortest, k)
                kept = 0
                while kept < len(proposal) and at + kept < len(out) and out[at + kept] == proposal[kept]:
                    kept += 1
                rounds += 1
                drafting += bool(proposal)
                drafted += len(proposal)
                accepted += kept
                step = min(kept + 1, len(out) - at)
                at += step
                emitted += step
        print(
            f"n {longest}..{shortest} k {k}: {rounds} rounds, {emitted} tokens, {emitted / rounds:.2f} a round; "
            f"{drafting} rounds drafted {drafted}, accepted {accepted} ({accepted / max(drafted, 1):.2f})"
        )


if __name__ == "__main__":
    main()

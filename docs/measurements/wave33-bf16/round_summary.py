"""Scratch (wave 33, docs/performance.md "A lone proposal drafts to its floor"): `python round_summary.py LOG...`
over coordinator DEBUG logs: per log, its round lines summarised (rounds, mean γ asked, drafted, accepted, batch,
the share of γ = 0, drafting rounds at batch 1, rounds asking γ > 6), then per γ asked (rounds, mean drafted, mean
floor sent) and, over all logs given, the target's forward by tokens verified (drafted + 1) in batch-1 rounds."""

import collections
import re
import sys
from pathlib import Path
from statistics import mean

LINE = re.compile(
    r"round: gamma (\d+) drafted (\d+) accepted (\d+) alpha \S+ (?:floor ([0-9.]+)\S* )?batch (\d+) .*?"
    r"target forward ([0-9.]+)"
)


def rounds(path: str) -> list[tuple[int, int, int, float, int, float]]:
    found = (LINE.search(line) for line in Path(path).read_text(errors="replace").splitlines())
    return [(int(m[1]), int(m[2]), int(m[3]), float(m[4] or "nan"), int(m[5]), float(m[6])) for m in found if m]


def main() -> None:
    by_tokens: dict[int, list[float]] = collections.defaultdict(list)
    for path in sys.argv[1:]:
        rs = rounds(path)
        print(
            f"{Path(path).name}: rounds {len(rs)}, mean gamma {mean(r[0] for r in rs):.2f}, drafted "
            f"{mean(r[1] for r in rs):.2f}, accepted {mean(r[2] for r in rs):.2f}, batch {mean(r[4] for r in rs):.2f}, "
            f"gamma-0 share {sum(r[0] == 0 for r in rs) / len(rs):.2f}, drafting rounds at batch 1 "
            f"{sum(r[4] == 1 and r[1] > 0 for r in rs)}, rounds asking gamma > 6 {sum(r[0] > 6 for r in rs)}"
        )
        by_gamma = collections.defaultdict(list)
        for r in rs:
            by_gamma[r[0]].append(r)
            if r[4] == 1:
                by_tokens[r[1] + 1].append(r[5])
        for gamma, group in sorted(by_gamma.items()):
            if gamma:
                print(
                    f"  gamma {gamma:2d}: {len(group)} rounds, drafted {mean(r[1] for r in group):.2f}, "
                    f"floor {mean(r[3] for r in group):.2f}"
                )
    print("target forward at batch 1 by tokens verified (all logs):")
    for tokens, ms in sorted(by_tokens.items()):
        print(f"  {tokens:2d} tokens: {len(ms)} rounds, {mean(ms):.1f} ms")


if __name__ == "__main__":
    main()

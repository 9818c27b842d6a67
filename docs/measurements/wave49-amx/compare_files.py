"""Two calibration export files side by side: events, pairs, pairs counted more than λ, their overlap, and the
rejection concentration (share of the events in the top x % of pairs).

`python docs/measurements/wave49-amx/compare_files.py A.json B.json [LAMBDA ...]` (default λ 4 and 6). Counts only:
which pairs a served memory seeded with each file could rescue from the first request.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def pairs(path: str) -> dict[tuple[int, int], int]:
    doc = json.loads(Path(path).read_text())
    return {(d, t): c for d, t, c in doc["pairs"]}


def top_share(counts: list[int], fraction: float) -> float:
    ranked = sorted(counts, reverse=True)
    top = ranked[: max(1, round(len(ranked) * fraction))]
    return sum(top) / sum(ranked) if ranked else 0.0


def main(a_path: str, b_path: str, lambdas: list[int]) -> None:
    a, b = pairs(a_path), pairs(b_path)
    for name, table in (("A", a), ("B", b)):
        shares = ", ".join(f"top {int(f * 100)} % {top_share(list(table.values()), f):.1%}" for f in (0.1, 0.2))
        print(f"{name}: {sum(table.values()):,} events in {len(table):,} pairs (file: counted >= 2); {shares}")
    both = a.keys() & b.keys()
    only_a, only_b = len(a.keys() - b.keys()), len(b.keys() - a.keys())
    print(f"pairs in both files: {len(both):,}; A only {only_a:,}; B only {only_b:,}")
    for lam in lambdas:
        over_a = {p for p, c in a.items() if c > lam}
        over_b = {p for p, c in b.items() if c > lam}
        print(f"λ = {lam}: counted more than λ: A {len(over_a)}, B {len(over_b)}, both {len(over_a & over_b)}; "
              f"A's rescuable events {sum(a[p] for p in over_a):,}, B's {sum(b[p] for p in over_b):,}")  # fmt: skip
    moved = sorted(both, key=lambda p: -abs(a[p] - b[p]))[:10]
    print("largest count changes (draft id, target id: A → B):", ", ".join(f"{p}: {a[p]} → {b[p]}" for p in moved))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3:]] or [4, 6])

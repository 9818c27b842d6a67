"""Scratch (wave 30): decode-phase figures from the coordinator's DEBUG round lines (wave 30's format).

`python rounds.py coordinator.log`: for rounds with >= 6 rows, per segment (ar: γ 0 with alpha nan; adaptive;
fixed γ), tokens per row-round, the mean round time with its waits, and what 8 rows of that deliver in tok/s.
"""

import collections
import re
import statistics as st
import sys

PAT = re.compile(
    r"gamma (\d+) drafted (\d+) accepted (\d+) alpha (\S+) batch (\d+) \| predicted (\S+) ms, measured (\S+) ms "
    r"\(target forward (\S+), draft forwards ([^;)]+)[;)].*?waited (\S+) ms \((\S+) at the start\)"
)


def segment(row: tuple[str, ...]) -> str:
    gamma, alpha = row[0], row[3]
    if alpha == "nan":
        return "ar" if gamma == "0" else "fixed"
    return "adaptive"


with open(sys.argv[1], errors="replace") as log:
    rows = [m.groups() for line in log if (m := PAT.search(line))]
for kind in ("ar", "adaptive", "fixed"):
    full = [r for r in rows if segment(r) == kind and int(r[4]) >= 6]
    if not full:
        continue
    tokens = st.mean(int(r[2]) + 1 for r in full)
    ms = st.mean(float(r[6]) + float(r[9]) for r in full)

    def median(i: int, full: list = full) -> float:
        return st.median(float(r[i]) for r in full)

    print(
        f"{kind} {len(full)} rounds: tokens/row-round {tokens:.2f}, round+wait {ms:.1f} ms -> "
        f"{8 * tokens / ms * 1e3:.1f} tok/s at 8 rows; medians: target forward {median(7):.1f}, draft forwards "
        f"{median(8):.1f}, waited"
        f" {median(9):.1f} ({median(10):.1f} at the start)"
    )
    print("  gamma:", collections.Counter(r[0] for r in full).most_common())

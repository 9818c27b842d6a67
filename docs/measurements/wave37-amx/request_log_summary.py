"""Sums the coordinators' request-log lines of wave 37's concurrency-8 A/Bs by level (24 requests each, in the
order the driver ran them): `python request_log_summary.py ab-c8-request-logs/*.log > request-log-summary.txt`."""

from __future__ import annotations

import sys
from pathlib import Path

LEVEL = 24  # requests a level (REQS=24)


def fields(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def summary(path: Path) -> list[str]:
    lines = [fields(line) for line in path.read_text().splitlines() if line.strip()]
    out = []
    for start in range(0, len(lines), LEVEL):
        level = lines[start : start + LEVEL]
        modes = {r["mode"] for r in level}
        rounds, drafted, accepted, tokens = (
            sum(int(r[k]) for r in level) for k in ("rounds", "drafted", "accepted", "tokens")
        )
        acceptance = f"{accepted / drafted:.3f}" if drafted else "-"
        out.append(
            f"{path.name} level {start // LEVEL + 1}: mode {'/'.join(sorted(modes))}, {len(level)} requests, "
            f"{rounds} row-rounds, drafted {drafted / rounds:.2f} and emitted {tokens / rounds:.2f} tokens "
            f"a row-round, acceptance {acceptance}"
        )
    return out


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print("\n".join(summary(Path(name))))

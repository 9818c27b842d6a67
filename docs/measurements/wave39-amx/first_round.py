"""Scratch (wave 39): what a newcomer waits for before its first round, from a coordinator's DEBUG log (gzipped).

`python docs/measurements/wave39-amx/first_round.py LOG.gz`: per mode, over each request after the first 8 (the load
level's cold start), the mean time from the request's start to its first round's start ("before the start gate": the
Prefill calls), the mean wait at that round's start, and the mean time to its first round's end (its first tokens).
A request's start is its request-log line's time less its latency; a round's start is its round line's time less
the round's measured and waited times.
"""

from __future__ import annotations

import datetime
import gzip
import re
import statistics
import sys

ROUND = re.compile(r"request (\w+) round: .*measured ([\d.]+) ms.*waited ([\d.]+) ms \(([\d.]+) at the start\)")
REQUEST = re.compile(r"mode=(\w+).*ttft_ms=([\d.]+) latency_ms=([\d.]+) session=(\w+)")


def stamp_ms(line: str) -> float:
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000


def main() -> None:
    first: dict[str, tuple[float, float, float]] = {}  # session: (round start, wait at its start, round end)
    requests: list[tuple[str, float, str]] = []  # (mode, start, session)
    with gzip.open(sys.argv[1], "rt") as log:
        for line in log:
            if (m := ROUND.search(line)) and m.group(1) not in first:
                end = stamp_ms(line)
                first[m.group(1)] = (end - float(m.group(2)) - float(m.group(3)), float(m.group(4)), end)
            elif m := REQUEST.search(line):
                requests.append((m.group(1), stamp_ms(line) - float(m.group(3)), m.group(4)))
    by_mode: dict[str, list[tuple[float, float, float]]] = {}
    for mode, start, session in requests:
        if session in first:
            round_start, wait, end = first[session]
            by_mode.setdefault(mode, []).append((round_start - start, wait, end - start))
    for mode, rows in by_mode.items():
        rows = rows[8:]
        prefill, wait, ttft = (statistics.mean(column) for column in zip(*rows, strict=True))
        print(f"{mode}: {len(rows)} requests; before the start gate {prefill:.0f} ms, wait at the first round's "
              f"start {wait:.0f} ms, first round's end {ttft:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()

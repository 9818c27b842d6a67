"""Scratch (wave 35): a target service whose verify rounds' parts are timed (ns) into /tmp/s1/tparts.jsonl; same flags
as `python -m target_service` (less `--stop-when-stdin-closes`). Summarised by target_parts.py."""

import functools
import json
import sys
import time

import target_service.engine as engine

RECORDS = open("/tmp/s1/tparts.jsonl", "w")  # noqa: SIM115 (open for the process's life)
parts: dict[str, int] = {}


def timed(owner, name):
    untimed = getattr(owner, name)

    @functools.wraps(untimed)
    def part(*args, **kwargs):
        start = time.perf_counter_ns()
        result = untimed(*args, **kwargs)
        parts[name] = parts.get(name, 0) + time.perf_counter_ns() - start
        return result

    setattr(owner, name, part)


for method in ("_verify_input", "_check_emitted", "_record_events"):
    timed(engine.TargetEngine, method)
timed(engine, "verify")
timed(engine, "forward_rows")
untimed_round = engine.TargetEngine._round


def whole_round(self, rows):  # the compute thread's hand-off included
    parts.clear()
    start = time.perf_counter_ns()
    results = untimed_round(self, rows)
    parts.update(round=time.perf_counter_ns() - start, rows=len(rows), d=len(rows[0].draft))
    RECORDS.write(json.dumps(parts) + "\n")
    RECORDS.flush()
    return results


engine.TargetEngine._round = whole_round
from target_service.__main__ import main  # noqa: E402 (after the patch)

sys.argv = ["target_service", *sys.argv[1:]]
main()

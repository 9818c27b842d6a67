"""Scratch (wave 35): a coordinator whose gRPC calls record (request type, wall ns, the response's Timing) to
/tmp/s1/calls.jsonl; same flags as `python -m coordinator`. Summarised by call_parts.py."""

import json
import sys
import time

import coordinator.clients as clients

RECORDS = open("/tmp/s1/calls.jsonl", "w")  # noqa: SIM115 (open for the process's life)
untimed = clients._call


def timed(service, fn, request, timeout):
    start = time.perf_counter_ns()
    response = untimed(service, fn, request, timeout)
    record = {"svc": service, "m": type(request).__name__, "wall": time.perf_counter_ns() - start}
    timing = getattr(response, "timing", None)
    if timing is not None:
        record |= {"total": timing.total_ns, "fwd": timing.forward_ns, "ver": timing.verify_ns, "mem": timing.memory_ns}
    if hasattr(request, "num_tokens"):
        record["n"] = request.num_tokens
    if hasattr(request, "draft_token_ids"):
        record["d"] = len(request.draft_token_ids)
    RECORDS.write(json.dumps(record) + "\n")
    RECORDS.flush()
    return response


clients._call = timed
from coordinator.__main__ import main  # noqa: E402 (after the patch)

sys.argv = ["coordinator", *sys.argv[1:]]
main()

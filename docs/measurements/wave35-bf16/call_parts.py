"""Scratch (wave 35): `python call_parts.py calls.jsonl`: coord_timed.py's records, per RPC: the call's wall time
outside the service's handler, and the handler's time outside its forwards (verify math and memory apart), ms."""

import json
import statistics as st
import sys
from collections import defaultdict

groups = defaultdict(list)
with open(sys.argv[1]) as lines:
    for record in map(json.loads, lines):
        groups[record["m"]].append(record)
for method, records in groups.items():
    print(method, len(records))
    if "total" not in records[0]:
        continue
    parts = {
        "call - handler": lambda r: r["wall"] - r["total"],
        "handler - forward - verify - memory": lambda r: r["total"] - r["fwd"] - r["ver"] - r["mem"],
        "verify": lambda r: r["ver"],
        "memory": lambda r: r["mem"],
    }
    for name, part in parts.items():
        values = [part(r) / 1e6 for r in records if r.get("d", 1) > 0 and r.get("n", 1) > 0]
        if values:
            print(f"   {name:36s} median {st.median(values):.3f} mean {st.mean(values):.3f}")

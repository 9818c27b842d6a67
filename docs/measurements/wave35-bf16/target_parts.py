"""Scratch (wave 35): `python target_parts.py tparts.jsonl`: the parts of target_timed.py's drafting rounds, ms."""

import json
import statistics as st
import sys

with open(sys.argv[1]) as records:
    rounds = [r for r in map(json.loads, records) if "round" in r and r.get("d", 0) > 0]
print(len(rounds), "drafting rounds")
parts = ["round", "forward_rows", "_verify_input", "verify", "_check_emitted", "_record_events"]
for part in parts:
    values = [r.get(part, 0) / 1e6 for r in rounds]
    print(f"  {part:16s} median {st.median(values):.3f} mean {st.mean(values):.3f}")
rest = [(r["round"] - sum(r.get(p, 0) for p in parts[1:])) / 1e6 for r in rounds]
print(f"  {'round - parts':16s} median {st.median(rest):.3f} mean {st.mean(rest):.3f}")

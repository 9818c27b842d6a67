"""Scratch (wave 30): split the coordinator's DEBUG round lines (0eb21c6's format) of rounds with ≥ 7 rows.

`python breakdown.py coordinator.log`: medians and means of the round, its forwards, the services' handlers, the
Propose call and the lockstep waits, in ms.
"""

import re
import statistics as st
import sys

PAT = re.compile(
    r"batch (\d+) \| predicted (\S+) ms, measured (\S+) ms \(target forward (\S+), draft forwards (\S+); "
    r"Verify (\S+) in the target, Propose (\S+) in the draft, (\S+) at the caller\), waited (\S+) ms \((\S+) at"
)
NAMES = "batch predicted measured target_forward draft_forwards verify_handler propose_handler propose_call waited "
NAMES += "waited_at_start"

with open(sys.argv[1], errors="replace") as log:
    rows = [[float(x) for x in m.groups()] for line in log if (m := PAT.search(line))]
full = [r for r in rows if r[0] >= 7]
print(f"{len(full)} rounds with >= 7 rows")
for i, name in enumerate(NAMES.split()):
    print(f"{name:16s} median {st.median(r[i] for r in full):6.1f} mean {st.mean(r[i] for r in full):6.1f}")
rest = [r[2] - r[7] - r[5] for r in full]
print(f"{'rest':16s} median {st.median(rest):6.1f} mean {st.mean(rest):6.1f}  (round - Propose call - Verify handler)")

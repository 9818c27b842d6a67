"""Scratch (wave 31): `python c1_breakdown.py coordinator.log`: the parts of the batch-1 rounds of a coordinator's DEBUG
log (drafting and target-only rounds apart), ms: what is not a forward, split into the handlers and the calls."""

import re
import statistics as st
import sys

PAT = re.compile(
    r"round: gamma (\d+) drafted (\d+) accepted (\d+) alpha \S+ batch (\d+) \| predicted \S+ ms, measured (\S+) ms "
    r"\(target forward (\S+), draft forwards (\S+); Verify (\S+) in the target, Propose (\S+) in the draft, "
    r"(\S+) at the caller\), waited (\S+) ms"
)
rows = []
with open(sys.argv[1], errors="replace") as log:
    lines = log.readlines()
for line in lines:
    m = PAT.search(line)
    if m:
        rows.append([float(x) for x in m.groups()])


def show(name, rs):
    if not rs:
        return
    print(f"{name}: {len(rs)} rounds")
    cols = {
        "measured": 4,
        "target_fwd": 5,
        "draft_fwd": 6,
        "verify_handler": 7,
        "propose_handler": 8,
        "propose_call": 9,
        "waited": 10,
    }
    for k, i in cols.items():
        print(f"  {k:16s} median {st.median(r[i] for r in rs):7.2f} mean {st.mean(r[i] for r in rs):7.2f}")
    parts = {
        "overhead (measured - fwds)": [r[4] - r[5] - r[6] for r in rs],
        "verify handler - fwd": [r[7] - r[5] for r in rs],
        "propose handler - fwd": [r[8] - r[6] for r in rs],
        "propose call - handler": [r[9] - r[8] for r in rs],
        "rest (measured - call - verify handler)": [r[4] - r[9] - r[7] for r in rs],
    }
    for k, v in parts.items():
        print(f"  {k:40s} median {st.median(v):6.2f} mean {st.mean(v):6.2f}")


b1 = [r for r in rows if r[3] == 1]
show("drafting rounds (gamma>0)", [r for r in b1 if r[0] > 0])
show("target-only rounds", [r for r in b1 if r[0] == 0])

"""Scratch (wave 31): `python c1_requests.py coordinator.log ar,csd,sd,csd`: per request (four a mode, in the order
sent), rounds, tokens, time, the γ chosen and the tokens drafted per round."""

import collections
import re
import sys

PAT = re.compile(
    r"request (\S+) round: gamma (\d+) drafted (\d+) accepted (\d+) alpha (\S+) batch (\d+) \| "
    r"predicted (\S+) ms, measured (\S+) ms \(target forward (\S+), draft forwards ([\d.]+)"
)
reqs = collections.OrderedDict()
with open(sys.argv[1], errors="replace") as log:
    lines = log.readlines()
for line in lines:
    m = PAT.search(line)
    if m:
        rid = m.group(1)
        reqs.setdefault(rid, []).append([float(x) for x in m.groups()[1:]])
modes = sys.argv[2].split(",")
for i, rs in enumerate(reqs.values()):
    mode = modes[i // 4] if i // 4 < len(modes) else "?"
    n = len(rs)
    t = sum(r[6] for r in rs)
    drafted = [r for r in rs if r[0] > 0]
    toks = sum(r[2] + 1 for r in rs)  # accepted + 1 (correction/bonus), approximate
    gam = collections.Counter(int(r[0]) for r in rs)
    dr = collections.Counter(int(r[1]) for r in drafted)
    kept = f"{sum(r[2] for r in drafted)}/{sum(r[1] for r in drafted)}"
    print(
        f"{mode:4s} prompt {i % 4}: rounds {n:3d}, ~{toks} tokens, {t / 1000:5.2f} s -> {toks / t * 1000:5.2f} tok/s; "
        f"gamma {dict(sorted(gam.items()))}; drafted {dict(sorted(dr.items()))}; acc/drafted {kept}"
    )

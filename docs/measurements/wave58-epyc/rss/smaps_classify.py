"""Read-only: a process's anonymous RSS by kind of mapping, from /proc/PID/smaps.
usage: smaps_classify.py PID LABEL OUTCSV
kinds: brk = [heap] (glibc main arena); arena64 = a rw-p anon VMA whose next VMA is ---p anon and the two span 64 MiB
(a glibc non-main arena heap); stack = rw-p anon VMA right after a 4 KiB ---p guard (thread stacks); anon_other = other
anonymous rw-p (pymalloc 1 MiB arenas, glibc mmapped chunks, Rust/ONNX large allocations; the kernel may merge adjacent
ones); file = file-backed."""

import csv
import os
import sys
import time

pid, label, out = sys.argv[1], sys.argv[2], sys.argv[3]
vmas = []
cur = None
with open(f"/proc/{pid}/smaps") as f:
    for line in f:
        parts = line.split()
        if "-" in parts[0] and len(parts) >= 5 and not parts[0].endswith(":"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            cur = {
                "lo": lo,
                "hi": hi,
                "perm": parts[1],
                "ino": parts[4],
                "name": parts[5] if len(parts) > 5 else "",
                "rss": 0,
                "anon": 0,
            }
            vmas.append(cur)
        elif parts[0] == "Rss:":
            cur["rss"] = int(parts[1])
        elif parts[0] == "Anonymous:":
            cur["anon"] = int(parts[1])
kinds = {"brk": [0, 0, 0], "arena64": [0, 0, 0], "stack": [0, 0, 0], "anon_other": [0, 0, 0], "file": [0, 0, 0]}
sizes = []
for i, v in enumerate(vmas):
    size = v["hi"] - v["lo"]
    anon_map = v["ino"] == "0" and v["name"] in ("",)
    if v["name"] == "[heap]":
        k = "brk"
    elif (
        anon_map
        and v["perm"].startswith("rw")
        and i + 1 < len(vmas)
        and vmas[i + 1]["perm"].startswith("---")
        and vmas[i + 1]["lo"] == v["hi"]
        and vmas[i + 1]["hi"] - v["lo"] == 64 << 20
    ):
        k = "arena64"
    elif (
        anon_map
        and v["perm"].startswith("rw")
        and i > 0
        and vmas[i - 1]["perm"].startswith("---")
        and vmas[i - 1]["hi"] == v["lo"]
        and vmas[i - 1]["hi"] - vmas[i - 1]["lo"] == 4096
    ):
        k = "stack"
    elif anon_map:
        k = "anon_other"
        if v["anon"] > 1024:
            sizes.append((v["anon"], size >> 10))
    elif v["ino"] != "0":
        k = "file"
    else:
        continue  # [stack], [vdso] etc.
    kinds[k][0] += 1
    kinds[k][1] += v["rss"]
    kinds[k][2] += v["anon"]
row = {"ts": f"{time.time():.1f}", "label": label, "pid": pid}
for k, (n, _rss, anon) in kinds.items():
    row.update({f"{k}_n": n, f"{k}_anon_kb": anon})
row["anon_other_top"] = " ".join(f"{a}/{s}" for a, s in sorted(sizes, reverse=True)[:8])
new = not os.path.exists(out)
with open(out, "a", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(row))
    if new:
        w.writeheader()
    w.writerow(row)
print(row)

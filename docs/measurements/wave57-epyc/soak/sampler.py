"""Sample the coordinator (and the other services' RSS) every INTERVAL s into OUTDIR/series.csv.
usage: sampler.py OUTDIR COORD_PORT INTERVAL COUNT"""

import csv
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

OUTDIR, B, INTERVAL, COUNT = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
OUT = os.path.join(OUTDIR, "series.csv")
SVC = {
    "coordinator": ("coordinator", B),
    "target": ("target_service", B + 1),
    "draft": ("draft_service", B + 2),
    "memory": ("memory_service", B + 3),
}


def pids():
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    res = {}
    for line in out.splitlines():
        for short, (mod, port) in SVC.items():
            if f"-m {mod} " in line and f"--port {port} " in line + " ":
                res[short] = int(line.split()[0])
    return res


def kv(path, keys):
    d = {}
    for line in Path(path).read_text().splitlines():
        k, _, v = line.partition(":")
        if k in keys:
            d[k] = int(v.split()[0])
    return d


def nreq():
    try:
        with open(os.path.join(OUTDIR, "requests.csv")) as f:
            return sum(1 for _ in f) - 1
    except FileNotFoundError:
        return 0


def coord_metrics():
    try:
        txt = urllib.request.urlopen(f"http://127.0.0.1:{B + 5}/metrics", timeout=5).read().decode()
    except Exception:
        return {}
    d = {}
    for line in txt.splitlines():
        for k in (
            "calispec_requests_running",
            "calispec_http_generation_slots_free",
            "calispec_rpc_in_flight",
            "calispec_http_choices_waiting",
        ):
            if line.startswith(k + " "):
                d[k] = float(line.split()[-1])
    return d


def sample():
    ps = pids()
    row = {"ts": round(time.time(), 1), "requests_done": nreq()}
    c = ps.get("coordinator")
    st = kv(f"/proc/{c}/status", ("VmRSS", "RssAnon", "RssFile", "Threads", "VmData")) if c else {}
    sm = kv(f"/proc/{c}/smaps_rollup", ("Anonymous", "Private_Dirty", "Pss")) if c else {}
    row.update(
        {
            "c_pid": c,
            **{f"c_{k}": v for k, v in st.items()},
            **{f"c_sm_{k}": v for k, v in sm.items()},
            "c_fds": len(os.listdir(f"/proc/{c}/fd")) if c else None,
        }
    )
    if c:  # number of anonymous mappings (arenas / mmaps)
        with open(f"/proc/{c}/maps") as maps:
            row["c_nmaps"] = sum(1 for _ in maps)
    for short in ("target", "draft", "memory"):
        p = ps.get(short)
        row[f"{short}_rss_kb"] = kv(f"/proc/{p}/status", ("VmRSS",)).get("VmRSS") if p else None
    row.update({k.replace("calispec_", "m_"): v for k, v in coord_metrics().items()})
    new = not os.path.exists(OUT)
    with open(OUT, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow(row)


if __name__ == "__main__":
    for i in range(COUNT):
        sample()
        if i < COUNT - 1:
            time.sleep(INTERVAL)

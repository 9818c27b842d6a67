"""Sample resource usage of the tiny stack's four services every INTERVAL s into series.csv.
usage: sampler.py INTERVAL COUNT  (COUNT=1: one sample)"""

import contextlib
import csv
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

WORK = "/tmp/w53/soak"
OUT = os.path.join(WORK, "series.csv")
DB = os.path.join(WORK, "data/calispec/memory.db")
up = Path(WORK, "up.out").read_text()
METRICS = {m.group(1): m.group(2) for m in re.finditer(r"^(\w+)\s+127\.0\.0\.1:\d+\s+metrics: (\S+)", up, re.M)}
SVC = {"coordinator": "coordinator", "draft": "draft_service", "target": "target_service", "memory": "memory_service"}


def pids():
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    res = {}
    for line in out.splitlines():
        for short, mod in SVC.items():
            if f"-m {mod} " in line and "--port 2140" in line:
                res[short] = int(line.split()[0])
    return res


def status(pid):
    d = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "Threads"):
            d[k] = int(v.split()[0])
    d["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return d


def metrics(url):
    try:
        txt = urllib.request.urlopen(url, timeout=5).read().decode()
    except Exception:
        return {}
    d = {}
    for line in txt.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, val = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            d[name] = float(val)
    return d


def nreq():
    p = os.path.join(WORK, "requests.csv")
    try:
        return sum(1 for _ in open(p)) - 1
    except FileNotFoundError:
        return 0


WANT = {
    "coordinator": [
        "calispec_requests_running",
        "calispec_http_generation_slots_free",
        "calispec_http_choices_waiting",
        "calispec_rpc_in_flight",
    ],
    "draft": ["calispec_sessions_open", "calispec_prefix_cache_tokens", "calispec_rpc_in_flight"],
    "target": [
        "calispec_sessions_open",
        "calispec_verify_queue_depth",
        "calispec_prefix_cache_tokens",
        "calispec_memory_local_events",
        "calispec_rpc_in_flight",
    ],
    "memory": [
        "calispec_memory_events_received_total",
        "calispec_memory_events_committed_total",
        "calispec_rpc_in_flight",
    ],
}


def sample():
    row = {"ts": round(time.time(), 1), "requests_done": nreq()}
    ps = pids()
    for short in SVC:
        pid = ps.get(short)
        st = status(pid) if pid else {}
        row[f"{short}_pid"] = pid
        row[f"{short}_rss_kb"] = st.get("VmRSS")
        row[f"{short}_threads"] = st.get("Threads")
        row[f"{short}_fds"] = st.get("fds")
        m = metrics(METRICS.get(SVC[short], "")) if SVC[short] in METRICS else {}
        for k in WANT[short]:
            row[f"{short}:{k.replace('calispec_', '')}"] = m.get(k)
    for suf in ("", "-wal", "-shm"):
        p = DB + suf
        row[f"db{suf or '_main'}_bytes"] = os.path.getsize(p) if os.path.exists(p) else 0
    new = not os.path.exists(OUT)
    with open(OUT, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow(row)
    print(row, flush=True)


if __name__ == "__main__":
    interval, count = float(sys.argv[1]), int(sys.argv[2])
    for i in range(count):
        sample()
        if i < count - 1:
            time.sleep(interval)

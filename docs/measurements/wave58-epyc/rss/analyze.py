"""w58 RSS A/B analysis: slopes (least squares, MB/min) after the first 5 min of load, mallinfo2 over time, trims."""

# ruff: noqa: E501  (a scratch analysis kept as it ran: its report lines are long f-strings)
import csv
import statistics as st
import sys
from pathlib import Path

R = "/tmp/w58/rss/out"
T0 = float(Path(f"{R}/load_start_ts").read_text())
SKIP = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
MB = 1024.0  # kB -> MB (MiB)


def rows(p):
    try:
        with open(p) as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


def fit(xs, ys):
    n = len(xs)
    if n < 2:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=False)) / sum((x - mx) ** 2 for x in xs)


print(f"load start ts {T0:.0f}; slopes over samples with t >= {SKIP} min\n")
ser = {}
for N in "AB":
    s = [r for r in rows(f"{R}/{N}/series.csv") if r["c_VmRSS"]]
    ser[N] = s
    t = [(float(r["ts"]) - T0) / 60 for r in s]
    for key in ("c_VmRSS", "c_RssAnon"):
        y = [int(r[key]) / MB for r in s]
        sel = [(a, b) for a, b in zip(t, y, strict=False) if a >= SKIP]
        last20 = [(a, b) for a, b in zip(t, y, strict=False) if a >= t[-1] - 20]
        print(
            f"{N} {key:9s}: start {y[0]:7.1f}  @{SKIP:.0f}min {sel[0][1]:7.1f}  end {y[-1]:7.1f} MB (t={t[-1]:.1f} min, "
            f"req {s[-1]['requests_done']})  slope>= {SKIP:.0f}min {fit(*zip(*sel, strict=False)):+.3f} MB/min (n={len(sel)})"
            f"  last20 {fit(*zip(*last20, strict=False)):+.3f}  max {max(y):.1f}"
        )
    print(f"{N} threads {min(int(r['c_Threads']) for r in s)}..{max(int(r['c_Threads']) for r in s)}")
a, b = ser["A"][-1], ser["B"][-1]
print(
    f"\nfinal A-B: VmRSS {(int(a['c_VmRSS']) - int(b['c_VmRSS'])) / MB:+.1f} MB, RssAnon {(int(a['c_RssAnon']) - int(b['c_RssAnon'])) / MB:+.1f} MB"
)

F = ("arena", "hblkhd", "uordblks", "fordblks", "keepcost")
for N in "AB":
    m = [r for r in rows(f"{R}/{N}/mallinfo.csv") if float(r["ts"]) >= T0 - 60]
    print(
        f"\n{N} mallinfo2 (MB; rss/anon from /proc/self/status at the same moment; B's ticks are just before its trim)"
    )
    print(
        "   min  tag          rss    anon   arena  hblkhd  uordblks fordblks keepcost ordblks fastbin_n fastbin_MB thr  py_blocks  mi2_ms"
    )
    last = None
    for r in m:
        tm = (float(r["ts"]) - T0) / 60
        if r["tag"] != "tick" or last is None or tm - last >= 4.9 or r is m[-1]:
            last = tm if r["tag"] == "tick" else last
            print(
                f"{tm:6.1f}  {r['tag']:10s} {int(r['rss_kb']) / MB:7.1f} {int(r['anon_kb']) / MB:7.1f} "
                + " ".join(f"{int(r[k]) / 2**20:8.2f}" for k in F)
                + f" {r['ordblks']:>7s} {r['smblks']:>9s} {int(r['fsmblks']) / 2**20:10.3f} {r['threads']:>3s} {r['py_blocks']:>10s} {float(r['mallinfo2_ms']):7.3f}"
            )
    ticks = [r for r in m if (float(r["ts"]) - T0) / 60 >= SKIP]
    tt = [(float(r["ts"]) - T0) / 60 for r in ticks]
    print(
        f"{N} slopes t>={SKIP:.0f} min (MB/min): "
        + "  ".join(
            f"{k} {fit(tt, [int(r[k]) / 2**20 for r in ticks]):+.3f}"
            for k in (*F, "rss_kb", "anon_kb")
            if k not in ("rss_kb", "anon_kb")
        )
        + f"  rss {fit(tt, [int(r['rss_kb']) / MB for r in ticks]):+.3f}  anon {fit(tt, [int(r['anon_kb']) / MB for r in ticks]):+.3f}"
        + f"  py_blocks {fit(tt, [int(r['py_blocks']) for r in ticks]):+.0f}/min  max mallinfo2 {max(float(r['mallinfo2_ms']) for r in m):.3f} ms"
    )

for N in "AB":
    tr = rows(f"{R}/{N}/trim.csv")
    if not tr:
        continue
    print(f"\n{N} malloc_trim(0): {len(tr)} calls")
    for reason in sorted({r["reason"] for r in tr}):
        x = [r for r in tr if r["reason"] == reason]
        ms = [float(r["trim_ms"]) for r in x]
        rel = [int(r["released_kb"]) / MB for r in x]
        print(
            f"  {reason:10s} n={len(x):3d}  ms: median {st.median(ms):.3f} mean {st.mean(ms):.3f} max {max(ms):.3f}"
            f" | released (RssAnon) MB: first {rel[0]:.2f} median {st.median(rel):.2f} max {max(rel):.2f} total {sum(rel):.1f}"
        )
    if len(sys.argv) > 2:
        for r in tr:
            print(
                f"   {(float(r['ts']) - T0) / 60:6.1f} {r['reason']:10s} {float(r['trim_ms']):8.3f} ms  anon {int(r['anon_before_kb']) / MB:7.1f} -> {int(r['anon_after_kb']) / MB:7.1f}  thr {r['threads']}"
            )

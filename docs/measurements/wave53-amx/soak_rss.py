"""RSS (MB), threads and fds of each service over the soak, every ~5 minutes, and growth per 1,000 requests."""

import csv
import itertools

with open("/tmp/w53/soak/series.csv") as file:
    rows = list(csv.DictReader(file))
t0 = float(rows[0]["ts"])
print(
    f"{'min':>5} {'reqs':>6} "
    + " ".join(f"{s + ' MB':>14}" for s in ("coordinator", "draft", "target", "memory"))
    + "  threads(c/d/t/m)  fds(c/d/t/m)  sessions(d/t)"
)
for i, r in enumerate(rows):
    if i % 5 and i != len(rows) - 1:
        continue
    mb = [int(r[f"{s}_rss_kb"]) / 1024 for s in ("coordinator", "draft", "target", "memory")]
    th = "/".join(r[f"{s}_threads"] for s in ("coordinator", "draft", "target", "memory"))
    fd = "/".join(r[f"{s}_fds"] for s in ("coordinator", "draft", "target", "memory"))
    ses = f"{float(r['draft:sessions_open']):.0f}/{float(r['target:sessions_open']):.0f}"
    print(
        f"{(float(r['ts']) - t0) / 60:5.1f} {int(r['requests_done']):6d} "
        + " ".join(f"{m:14.1f}" for m in mb)
        + f"  {th:>16}  {fd:>12}  {ses}"
    )


def growth(a, b, s):
    d_req = (int(b["requests_done"]) - int(a["requests_done"])) / 1000
    return (int(b[f"{s}_rss_kb"]) - int(a[f"{s}_rss_kb"])) / 1024 / d_req if d_req else float("nan")


n = len(rows)
thirds = [rows[1], rows[n // 3], rows[2 * n // 3], rows[-1]]
for s in ("coordinator", "draft", "target", "memory"):
    print(
        s,
        "MB per 1,000 requests by thirds:",
        " ".join(f"{growth(a, b, s):+.2f}" for a, b in itertools.pairwise(thirds)),
    )

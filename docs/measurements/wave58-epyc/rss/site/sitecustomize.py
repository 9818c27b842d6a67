"""w58 RSS probe (not repo code). Acts only in a `python -m coordinator` process whose environment has
W58_MALLOC_OUT. A daemon thread:
- every W58_LOG_EVERY s (60) appends glibc mallinfo2() + VmRSS/RssAnon + threads + Python's allocated blocks to
  $W58_MALLOC_OUT/mallinfo.csv;
- if W58_TRIM_EVERY > 0, every that many seconds calls malloc_trim(0) (timed) and appends to trim.csv
  (RSS before/after, mallinfo2 after);
- every 2 s looks in $W58_MALLOC_OUT/cmd/ for files named trim-LABEL (a timed malloc_trim(0), reason LABEL) or
  info-LABEL (malloc_info(0, FILE*) into info-LABEL.xml; the FILE* checked), deletes each after acting on it."""

import contextlib
import os
import sys


def _w58_start():
    argv = list(getattr(sys, "orig_argv", []))
    try:
        i = argv.index("-m")
    except ValueError:
        return
    if i + 1 >= len(argv) or argv[i + 1] != "coordinator":
        return
    out = os.environ.get("W58_MALLOC_OUT")
    if not out:
        return
    import ctypes
    import threading
    import time

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    names = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")

    class MI2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in names]

    libc.mallinfo2.restype = MI2
    libc.mallinfo2.argtypes = []
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fopen.restype = ctypes.c_void_p
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.fclose.restype = ctypes.c_int
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.malloc_info.restype = ctypes.c_int

    trim_every = float(os.environ.get("W58_TRIM_EVERY", "0") or 0)
    log_every = float(os.environ.get("W58_LOG_EVERY", "60") or 60)
    cmd_dir = os.path.join(out, "cmd")
    os.makedirs(cmd_dir, exist_ok=True)
    mi_csv = os.path.join(out, "mallinfo.csv")
    trim_csv = os.path.join(out, "trim.csv")

    def status():
        d = {}
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon", "Threads"):
                    d[k] = int(v.split()[0])
        return d

    def mi():
        t0 = time.perf_counter()
        m = libc.mallinfo2()
        dt = (time.perf_counter() - t0) * 1000
        return {n: getattr(m, n) for n in names}, dt

    def append(path, row):
        new = not os.path.exists(path)
        with open(path, "a") as f:
            if new:
                f.write(",".join(row) + "\n")
            f.write(",".join(str(v) for v in row.values()) + "\n")

    def log_mi(tag):
        st = status()
        m, dt = mi()
        row = {
            "ts": f"{time.time():.1f}",
            "tag": tag,
            "rss_kb": st.get("VmRSS"),
            "anon_kb": st.get("RssAnon"),
            "threads": st.get("Threads"),
            "py_blocks": sys.getallocatedblocks(),
            "mallinfo2_ms": f"{dt:.3f}",
        }
        row.update(m)
        append(mi_csv, row)

    def trim(reason):
        st0 = status()
        t0 = time.perf_counter()
        r = libc.malloc_trim(0)
        dt = (time.perf_counter() - t0) * 1000
        st1 = status()
        m, _ = mi()
        row = {
            "ts": f"{time.time():.1f}",
            "reason": reason,
            "trim_ms": f"{dt:.3f}",
            "ret": r,
            "rss_before_kb": st0.get("VmRSS"),
            "rss_after_kb": st1.get("VmRSS"),
            "anon_before_kb": st0.get("RssAnon"),
            "anon_after_kb": st1.get("RssAnon"),
            "released_kb": st0.get("RssAnon", 0) - st1.get("RssAnon", 0),
            "threads": st0.get("Threads"),
        }
        row.update({f"after_{k}": v for k, v in m.items()})
        append(trim_csv, row)

    def info(label):
        path = os.path.join(out, f"info-{label}.xml").encode()
        fp = libc.fopen(path, b"w")
        if not fp:
            return
        try:
            libc.malloc_info(0, fp)
        finally:
            libc.fclose(fp)

    def loop():
        log_mi("start")
        next_log = time.monotonic() + log_every
        next_trim = time.monotonic() + trim_every if trim_every > 0 else None
        while True:
            time.sleep(2)
            try:
                for name in sorted(os.listdir(cmd_dir)):
                    kind, _, label = name.partition("-")
                    try:
                        os.unlink(os.path.join(cmd_dir, name))
                    except OSError:
                        continue
                    if kind == "trim":
                        trim(label or "manual")
                    elif kind == "info":
                        log_mi(f"info-{label}")
                        info(label)
                now = time.monotonic()
                if now >= next_log:
                    next_log += log_every
                    log_mi("tick")
                if next_trim is not None and now >= next_trim:
                    next_trim += trim_every
                    trim("periodic")
            except Exception as e:  # never take the coordinator down
                try:
                    with open(os.path.join(out, "probe-errors.txt"), "a") as f:
                        f.write(f"{time.time():.1f} {e!r}\n")
                except OSError:
                    pass

    threading.Thread(target=loop, name="w58-malloc-probe", daemon=True).start()


with contextlib.suppress(Exception):
    _w58_start()

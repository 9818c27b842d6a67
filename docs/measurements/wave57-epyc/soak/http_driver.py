"""HTTP-only soak driver (adapted from docs/measurements/wave53-amx/soak_driver.py's http_worker).
usage: http_driver.py OUTDIR HTTP_PORT DURATION_S CONCURRENCY MIX
MIX: all | comma list of kinds from KINDS. Appends one row per request to OUTDIR/requests.csv."""

import csv
import json
import os
import random
import socket
import sys
import threading
import time

import httpx

OUTDIR, PORT, DUR, CONC, MIX = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
HTTP = f"http://127.0.0.1:{PORT}"
TOKEN = os.environ.get("CALISPEC_TOKEN", "")
T_END = time.time() + DUR
LOCK = threading.Lock()
OUT = open(os.path.join(OUTDIR, "requests.csv"), "a", newline="")  # noqa: SIM115
W = csv.writer(OUT)
if OUT.tell() == 0:
    W.writerow(["t_start", "worker", "kind", "outcome", "latency_s", "detail"])
SHORT = [
    "def add(a, b):",
    "Once upon a time",
    "import numpy as np\n",
    "class Stack:\n    def __init__(self):",
    "The quick brown fox",
    "for i in range(10):",
    "# compute fibonacci\ndef fib(n):",
    "hello world",
]
LONG = "def add(a, b):\n    return a + b\n\n" * 40
TOO_LONG = "def add(a, b):\n    return a + b\n\n" * 70
MODES = ["ar", "sd", "csd"]
H = {"Authorization": "Bearer " + TOKEN}
# kind -> weight in the "all" mix (same proportions as wave 53's http_worker, plus stop/logprobs variants)
KINDS = {
    "comp": 0.20,
    "comp_stop": 0.05,
    "stream": 0.15,
    "stream_stop": 0.02,
    "n3": 0.10,
    "stream_n2": 0.06,
    "long_lp": 0.06,
    "disconnect": 0.08,
    "timeout": 0.06,
    "bad": 0.12,
    "chat": 0.05,
    "chat_stream": 0.05,
}
sel = list(KINDS) if MIX == "all" else MIX.split(",")
weights = [KINDS[k] for k in sel]


def rec(worker, kind, outcome, t0, detail=""):
    with LOCK:
        W.writerow(
            [round(t0, 3), worker, kind, outcome, round(time.time() - t0, 4), str(detail)[:160].replace("\n", " ")]
        )
        OUT.flush()


def samp(rng):
    return (
        {"temperature": 0.8, "top_p": 0.95, "seed": rng.randrange(1 << 30)}
        if rng.random() < 0.5
        else {"temperature": 0.0}
    )


def sse_disconnect(body, n_events):
    s = socket.create_connection(("127.0.0.1", PORT), timeout=30)
    data = json.dumps(body).encode()
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + TOKEN.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(data)).encode()
        + b"\r\n\r\n"
        + data
    )
    buf = b""
    while buf.count(b"data: ") < n_events:
        chunk = s.recv(4096)
        if not chunk:
            break
        buf += chunk
    s.close()
    return buf.split(b"\r\n", 1)[0].decode(errors="replace")


def stream(cl, path, body):
    with cl.stream("POST", path, json=body) as resp:
        txt = "".join(resp.iter_text())
    return resp, txt


def worker(wid):
    rng = random.Random(wid * 7919 + int(time.time()))
    cl = httpx.Client(base_url=HTTP, headers=H, timeout=60)
    while time.time() < T_END:
        kind = rng.choices(sel, weights)[0]
        mode = rng.choice(MODES)
        sp = samp(rng)
        base = {"model": "target", "prompt": rng.choice(SHORT), "mode": mode, **sp}
        t0 = time.time()
        txt = None
        try:
            if kind == "comp":
                resp = cl.post("/v1/completions", json={**base, "max_tokens": 32, "logprobs": rng.choice([None, 2])})
            elif kind == "comp_stop":
                resp = cl.post("/v1/completions", json={**base, "max_tokens": 32, "stop": ["\n", "a b"]})
            elif kind == "stream":
                resp, txt = stream(
                    cl,
                    "/v1/completions",
                    {
                        **base,
                        "max_tokens": 32,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                        "logprobs": rng.choice([None, 1]),
                    },
                )
            elif kind == "stream_stop":
                resp, txt = stream(cl, "/v1/completions", {**base, "max_tokens": 32, "stream": True, "stop": ["\n"]})
            elif kind == "n3":
                resp = cl.post(
                    "/v1/completions",
                    json={**base, "prompt": [rng.choice(SHORT), rng.choice(SHORT)], "n": 3, "max_tokens": 24},
                )
            elif kind == "stream_n2":
                resp, txt = stream(cl, "/v1/completions", {**base, "n": 2, "max_tokens": 24, "stream": True})
            elif kind == "long_lp":
                resp = cl.post(
                    "/v1/completions", json={**base, "prompt": LONG, "max_tokens": 48, "temperature": 0, "logprobs": 2}
                )
            elif kind == "disconnect":
                line = sse_disconnect(
                    {**base, "max_tokens": 300, "ignore_eos": True, "stream": True, "n": rng.choice([1, 2])},
                    rng.choice([1, 3]),
                )
                rec(wid, kind, "DISCONNECTED", t0, line)
                continue
            elif kind == "timeout":
                try:
                    cl.post(
                        "/v1/completions", json={**base, "max_tokens": 500, "ignore_eos": True, "n": 2}, timeout=0.2
                    )
                    rec(wid, kind, "OK", t0, "finished before timeout")
                except httpx.TimeoutException:
                    rec(wid, kind, "CLIENT_TIMEOUT", t0)
                continue
            elif kind == "bad":
                bad = rng.choice(
                    [
                        {"temperature": -1},
                        {"max_tokens": -5},
                        {"n": 17},
                        {"top_p": 3},
                        {"mode": "bogus"},
                        {"prompt": []},
                        {"logprobs": 50},
                        {"prompt": TOO_LONG},
                        {"suffix": "x"},
                    ]
                )
                kind += "_" + next(iter(bad))
                resp = cl.post("/v1/completions", json={**base, "max_tokens": 8, **bad})
            elif kind == "chat":
                resp = cl.post(
                    "/v1/chat/completions",
                    json={
                        "model": "target",
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 8,
                        "stream": rng.random() < 0.5,
                    },
                )
            elif kind == "chat_stream":
                resp, txt = stream(
                    cl,
                    "/v1/chat/completions",
                    {
                        "model": "target",
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 8,
                        "stream": True,
                    },
                )
            st = resp.status_code
            if txt is not None and st == 200 and ("[DONE]" not in txt or '"error"' in txt):
                rec(wid, kind, "STREAM_BAD", t0, txt[-160:])
                continue
            detail = ""
            if st != 200:
                try:
                    detail = resp.json()["error"]["message"]
                except Exception:
                    detail = (txt or "")[:160]
            rec(wid, kind, "OK" if st == 200 else f"HTTP{st}", t0, detail)
        except Exception as e:
            rec(wid, kind, "EXC:" + type(e).__name__, t0, e)
    cl.close()


if __name__ == "__main__":
    ths = [threading.Thread(target=worker, args=(i,)) for i in range(CONC)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    print("driver done", flush=True)

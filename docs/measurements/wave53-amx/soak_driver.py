"""Soak driver: mixed gRPC (sync + async SDK) and OpenAI HTTP load against the tiny stack, 5 clients.
usage: soak_driver.py DURATION_S   -> appends one row per request to requests.csv
Each row: t_start, worker, kind, expect (ok|cancel|bad), outcome (OK or error code/status), latency_s, detail."""

import asyncio
import csv
import json
import os
import random
import socket
import sys
import threading
import time

import httpx

from calispec.client import AsyncCalispecClient, CalispecClient, CalispecRpcError

WORK = "/tmp/w53/soak"
GRPC = "127.0.0.1:21400"
HTTP = "http://127.0.0.1:21404"
TOKEN = os.environ["CALISPEC_TOKEN"]
DUR = float(sys.argv[1])
T_END = time.time() + DUR
LOCK = threading.Lock()
OUT = open(os.path.join(WORK, "requests.csv"), "a", newline="")  # noqa: SIM115 (open for the whole run)
W = csv.writer(OUT)
if OUT.tell() == 0:
    W.writerow(["t_start", "worker", "kind", "expect", "outcome", "latency_s", "detail"])
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
LONG = "def add(a, b):\n    return a + b\n\n" * 40  # ~640 tokens
TOO_LONG = "def add(a, b):\n    return a + b\n\n" * 70  # ~1120 tokens > 1023 context
MODES = ["ar", "sd", "csd"]


def rec(worker, kind, expect, outcome, t0, detail=""):
    with LOCK:
        W.writerow(
            [
                round(t0, 3),
                worker,
                kind,
                expect,
                outcome,
                round(time.time() - t0, 4),
                str(detail)[:200].replace("\n", " "),
            ]
        )
        OUT.flush()


def samp(rng):
    return (
        {"temperature": 0.8, "top_p": 0.95, "seed": rng.randrange(1 << 30)}
        if rng.random() < 0.5
        else {"temperature": 0.0}
    )


# ---------------- sync gRPC ----------------
def grpc_worker(wid):
    rng = random.Random(wid)
    c = CalispecClient(GRPC, timeout=60)
    while time.time() < T_END:
        r = rng.random()
        mode = rng.choice(MODES)
        sp = samp(rng)
        g = "samp" if sp["temperature"] else "greedy"
        t0 = time.time()
        try:
            if r < 0.35:
                kind = f"g_gen_{mode}_{g}"
                expect = "ok"
                c.generate(rng.choice(SHORT), max_new_tokens=32, mode=mode, **sp)
            elif r < 0.55:
                kind = f"g_stream_{mode}_{g}"
                expect = "ok"
                for _ in c.generate_stream(rng.choice(SHORT), max_new_tokens=32, mode=mode, **sp):
                    pass
            elif r < 0.63:
                kind = f"g_long_{mode}"
                expect = "ok"
                c.generate(LONG, max_new_tokens=48, mode=mode, temperature=0.0)
            elif r < 0.71:
                kind = "g_stream_sdkcancel"
                expect = "cancel"
                it = c.generate_stream(rng.choice(SHORT), max_new_tokens=200, ignore_eos=True, mode=mode, **sp)
                next(it)
                next(it)
                it.close()  # generator finally -> call.cancel()
                rec(wid, kind, expect, "CANCELLED_BY_CLIENT", t0)
                continue
            elif r < 0.79:
                kind = "g_deadline"
                expect = "cancel"
                c.generate(rng.choice(SHORT), max_new_tokens=400, ignore_eos=True, mode=mode, timeout=0.15)
            elif r < 0.87:
                kind = "g_bad"
                expect = "bad"
                bad = rng.choice(
                    [
                        dict(temperature=-1.0),
                        dict(top_p=1.5),
                        dict(max_new_tokens=10**6),
                        dict(num_speculative_tokens=10**4),
                        dict(stop_token_ids=list(range(20))),
                    ]
                )
                kind += "_" + "_".join(bad)
                c.generate(rng.choice(SHORT), mode=mode, **bad)
            elif r < 0.92:
                kind = "g_toolong"
                expect = "bad"
                c.generate(TOO_LONG, max_new_tokens=16, mode=mode)
            elif r < 0.96:
                kind = "g_chat_notemplate"
                expect = "bad"
                c.chat([{"role": "user", "content": "hi"}], max_new_tokens=8)
            else:
                kind = f"g_logprobs_{mode}"
                expect = "ok"
                c.generate(
                    rng.choice(SHORT), max_new_tokens=16, mode=mode, logprobs=3, prompt_logprobs=2, temperature=0.0
                )
            rec(wid, kind, expect, "OK", t0)
        except CalispecRpcError as e:
            rec(wid, kind, expect, e.code, t0, e.details)
        except Exception as e:
            rec(wid, kind, expect, "EXC:" + type(e).__name__, t0, e)
    c.close()


# ---------------- async gRPC ----------------
async def async_main(wid):
    rng = random.Random(wid)
    async with AsyncCalispecClient(GRPC, timeout=60) as c:
        while time.time() < T_END:
            r = rng.random()
            mode = rng.choice(MODES)
            sp = samp(rng)
            g = "samp" if sp["temperature"] else "greedy"
            t0 = time.time()
            try:
                if r < 0.4:
                    kind = f"a_gen_{mode}_{g}"
                    expect = "ok"
                    await c.generate(rng.choice(SHORT), max_new_tokens=32, mode=mode, **sp)
                elif r < 0.65:
                    kind = f"a_stream_{mode}_{g}"
                    expect = "ok"
                    async for _ in c.generate_stream(rng.choice(SHORT), max_new_tokens=32, mode=mode, **sp):
                        pass
                elif r < 0.8:
                    kind = "a_task_cancel"
                    expect = "cancel"
                    task = asyncio.ensure_future(
                        c.generate(rng.choice(SHORT), max_new_tokens=400, ignore_eos=True, mode=mode)
                    )
                    await asyncio.sleep(rng.uniform(0.02, 0.3))
                    task.cancel()
                    try:
                        await task
                        rec(wid, kind, expect, "OK", t0, "finished before cancel")
                        continue
                    except asyncio.CancelledError:
                        rec(wid, kind, expect, "CANCELLED_BY_CLIENT", t0)
                        continue
                elif r < 0.9:
                    kind = "a_stream_break"
                    expect = "cancel"
                    agen = c.generate_stream(rng.choice(SHORT), max_new_tokens=300, ignore_eos=True, mode=mode)
                    n = 0
                    async for _ in agen:
                        n += 1
                        if n == 3:
                            break
                    await agen.aclose()
                    rec(wid, kind, expect, "CANCELLED_BY_CLIENT", t0)
                    continue
                else:
                    kind = "a_deadline"
                    expect = "cancel"
                    await c.generate(rng.choice(SHORT), max_new_tokens=400, ignore_eos=True, mode=mode, timeout=0.1)
                rec(wid, kind, expect, "OK", t0)
            except CalispecRpcError as e:
                rec(wid, kind, expect, e.code, t0, e.details)
            except Exception as e:
                rec(wid, kind, expect, "EXC:" + type(e).__name__, t0, e)


def async_worker(wid):
    asyncio.run(async_main(wid))


# ---------------- HTTP ----------------
H = {"Authorization": "Bearer " + TOKEN}


def sse_disconnect(body, n_events):
    """raw socket: send a streaming request, read a few events, then close the TCP connection."""
    s = socket.create_connection(("127.0.0.1", 21404), timeout=30)
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


def http_worker(wid):
    rng = random.Random(wid)
    cl = httpx.Client(base_url=HTTP, headers=H, timeout=60)
    while time.time() < T_END:
        r = rng.random()
        mode = rng.choice(MODES)
        sp = samp(rng)
        g = "samp" if sp["temperature"] else "greedy"
        t0 = time.time()
        detail = ""
        try:
            if r < 0.25:
                kind = f"h_comp_{mode}_{g}"
                expect = "ok"
                resp = cl.post(
                    "/v1/completions",
                    json={"model": "target", "prompt": rng.choice(SHORT), "max_tokens": 32, "mode": mode, **sp},
                )
            elif r < 0.42:
                kind = f"h_comp_stream_{mode}_{g}"
                expect = "ok"
                with cl.stream(
                    "POST",
                    "/v1/completions",
                    json={
                        "model": "target",
                        "prompt": rng.choice(SHORT),
                        "max_tokens": 32,
                        "mode": mode,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                        **sp,
                    },
                ) as resp:
                    txt = "".join(resp.iter_text())
                if resp.status_code == 200 and ("[DONE]" not in txt or '"error"' in txt):
                    rec(wid, kind, expect, "STREAM_BAD", t0, txt[-200:])
                    continue
            elif r < 0.52:
                kind = f"h_comp_n3_{mode}_{g}"
                expect = "ok"
                resp = cl.post(
                    "/v1/completions",
                    json={
                        "model": "target",
                        "prompt": [rng.choice(SHORT), rng.choice(SHORT)],
                        "n": 3,
                        "max_tokens": 24,
                        "mode": mode,
                        **sp,
                    },
                )
            elif r < 0.58:
                kind = f"h_comp_stream_n2_{mode}"
                expect = "ok"
                with cl.stream(
                    "POST",
                    "/v1/completions",
                    json={
                        "model": "target",
                        "prompt": rng.choice(SHORT),
                        "n": 2,
                        "max_tokens": 24,
                        "mode": mode,
                        "stream": True,
                        **sp,
                    },
                ) as resp:
                    txt = "".join(resp.iter_text())
                if resp.status_code == 200 and ("[DONE]" not in txt or '"error"' in txt):
                    rec(wid, kind, expect, "STREAM_BAD", t0, txt[-200:])
                    continue
            elif r < 0.64:
                kind = f"h_long_{mode}"
                expect = "ok"
                resp = cl.post(
                    "/v1/completions",
                    json={
                        "model": "target",
                        "prompt": LONG,
                        "max_tokens": 48,
                        "mode": mode,
                        "temperature": 0,
                        "logprobs": 2,
                    },
                )
            elif r < 0.72:
                kind = "h_stream_disconnect"
                expect = "cancel"
                line = sse_disconnect(
                    {
                        "model": "target",
                        "prompt": rng.choice(SHORT),
                        "max_tokens": 300,
                        "ignore_eos": True,
                        "mode": mode,
                        "stream": True,
                        "n": rng.choice([1, 2]),
                    },
                    rng.choice([1, 3]),
                )
                rec(wid, kind, expect, "DISCONNECTED", t0, line)
                continue
            elif r < 0.78:
                kind = "h_nonstream_clienttimeout"
                expect = "cancel"
                try:
                    cl.post(
                        "/v1/completions",
                        json={
                            "model": "target",
                            "prompt": rng.choice(SHORT),
                            "max_tokens": 500,
                            "ignore_eos": True,
                            "mode": mode,
                            "n": 2,
                        },
                        timeout=0.2,
                    )
                    rec(wid, kind, expect, "OK", t0, "finished before timeout")
                    continue
                except httpx.TimeoutException:
                    rec(wid, kind, expect, "CLIENT_TIMEOUT", t0)
                    continue
            elif r < 0.90:
                kind = "h_bad"
                expect = "bad"
                bad = rng.choice(
                    [
                        {"temperature": -1},
                        {"max_tokens": -5},
                        {"n": 17},
                        {"top_p": 3},
                        {"mode": "bogus"},
                        {"prompt": []},
                        {"stop": ["\ud800"]},
                        {"logprobs": 50},
                        {"prompt": TOO_LONG},
                        {"suffix": "x"},
                    ]
                )
                kind += "_" + next(iter(bad))
                resp = cl.post(
                    "/v1/completions", json={"model": "target", "prompt": rng.choice(SHORT), "max_tokens": 8, **bad}
                )
            elif r < 0.95:
                kind = "h_chat_notemplate"
                expect = "bad"
                resp = cl.post(
                    "/v1/chat/completions",
                    json={
                        "model": "target",
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 8,
                        "stream": rng.random() < 0.5,
                    },
                )
            else:
                kind = "h_chat_stream_notemplate"
                expect = "bad"
                with cl.stream(
                    "POST",
                    "/v1/chat/completions",
                    json={
                        "model": "target",
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 8,
                        "stream": True,
                    },
                ) as resp:
                    resp.read()
            st = resp.status_code
            if st != 200:
                try:
                    detail = resp.json()["error"]["message"]
                except Exception:
                    detail = resp.text[:200] if True else ""
            rec(wid, kind, expect, "OK" if st == 200 else f"HTTP{st}", t0, detail)
        except Exception as e:
            rec(wid, kind, expect, "EXC:" + type(e).__name__, t0, e)
    cl.close()


if __name__ == "__main__":
    ths = [
        threading.Thread(target=grpc_worker, args=(0,)),
        threading.Thread(target=grpc_worker, args=(1,)),
        threading.Thread(target=async_worker, args=(2,)),
        threading.Thread(target=http_worker, args=(3,)),
        threading.Thread(target=http_worker, args=(4,)),
    ]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    print("driver done", flush=True)

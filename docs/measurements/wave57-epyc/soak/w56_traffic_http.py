"""Copy of wave 56's helper traffic generator (/tmp/w56/soak/bin/traffic.py), adapted: bearer token from
CALISPEC_TOKEN on every HTTP client, one row per request to --rows (for the sampler's request count).
Steady mixed traffic at concurrency C for D seconds. kinds filter via --only."""

import argparse
import collections
import json
import os
import random
import string
import threading
import time

import httpx

from calispec.client import CalispecClient, CalispecRpcError

ap = argparse.ArgumentParser()
ap.add_argument("--grpc", default="127.0.0.1:53160")
ap.add_argument("--http", default="http://127.0.0.1:53164")
ap.add_argument("--concurrency", type=int, default=6)
ap.add_argument("--duration", type=float, default=2100)
ap.add_argument("--only", default="")
ap.add_argument("--rows", default="")
ap.add_argument("--log", default="/tmp/w56/soak/traffic.log")
args = ap.parse_args()
WORDS = [
    "the",
    "cat",
    "def",
    "return",
    "if",
    "else",
    "for",
    "while",
    "import",
    "class",
    "self",
    "print",
    "value",
    "list",
    "dict",
    "x",
    "y",
    "=",
    "+",
    "(",
    ")",
    ":",
    "\n",
    "0",
    "1",
    "2",
    "sum",
    "range",
    "once",
    "upon",
    "time",
]


def prompt(rng):
    n = rng.randint(4, 60)
    parts = []
    for _ in range(n):
        if rng.random() < 0.35:
            parts.append("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 8))))
        else:
            parts.append(rng.choice(WORDS))
    return " ".join(parts)


stats = collections.Counter()
lock = threading.Lock()
AUTH = {"Authorization": "Bearer " + os.environ.get("CALISPEC_TOKEN", "")}
ROWS = None


def bump(k):
    with lock:
        stats[k] += 1
        if ROWS is not None:
            ROWS.write(f"{time.time():.3f},{k}\n")
            ROWS.flush()


MODES = ["ar", "sd", "csd"]


def sample_params(rng):
    greedy = rng.random() < 0.5
    return dict(temperature=0.0 if greedy else rng.choice([0.7, 1.0]), seed=None if greedy else rng.randint(0, 10**6))


# ---- normal kinds
def grpc_unary(c, h, rng):
    p = sample_params(rng)
    c.generate(
        prompt(rng),
        max_new_tokens=rng.randint(8, 48),
        mode=rng.choice(MODES),
        logprobs=rng.choice([None, None, 3]),
        timeout=120,
        **p,
    )
    return "ok"


def grpc_stream(c, h, rng):
    p = sample_params(rng)
    for _ in c.generate_stream(
        prompt(rng),
        max_new_tokens=rng.randint(8, 48),
        mode=rng.choice(MODES),
        logprobs=rng.choice([None, 2]),
        timeout=120,
        **p,
    ):
        pass
    return "ok"


def http_completion(c, h, rng):
    body = dict(
        model=MODEL,
        prompt=prompt(rng) if rng.random() < 0.8 else [prompt(rng), prompt(rng)],
        max_tokens=rng.randint(8, 48),
        n=rng.choice([1, 1, 2, 3]),
        mode=rng.choice(MODES),
        logprobs=rng.choice([None, None, 0, 5]),
    )
    p = sample_params(rng)
    body["temperature"] = p["temperature"]
    if p["seed"] is not None:
        body["seed"] = p["seed"]
    body = {k: v for k, v in body.items() if v is not None}
    if rng.random() < 0.5:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
        with h.stream("POST", "/v1/completions", json=body, timeout=120) as r:
            r.raise_for_status()
            for _line in r.iter_lines():
                pass
    else:
        r = h.post("/v1/completions", json=body, timeout=120)
        r.raise_for_status()
    return "ok"


def http_chat(c, h, rng):
    r = h.post(
        "/v1/chat/completions",
        json=dict(model=MODEL, messages=[{"role": "user", "content": prompt(rng)}], max_tokens=16),
        timeout=60,
    )
    return f"chat_{r.status_code}"


# ---- abusive kinds (~10%)
def grpc_cancel(c, h, rng):
    it = c.generate_stream(prompt(rng), max_new_tokens=200, mode=rng.choice(MODES), ignore_eos=True, timeout=120)
    for i, _ in enumerate(it):
        if i >= rng.randint(0, 3):
            break
    it.close()
    return "cancelled"


def grpc_deadline(c, h, rng):
    try:
        fn = rng.choice([c.generate, lambda *a, **k: list(c.generate_stream(*a, **k))])
        fn(
            prompt(rng),
            max_new_tokens=400,
            ignore_eos=True,
            mode=rng.choice(MODES),
            timeout=rng.choice([0.05, 0.3, 1.0]),
        )
        return "deadline_not_hit"
    except CalispecRpcError as e:
        return "grpc_" + e.code


def grpc_invalid(c, h, rng):
    try:
        rng.choice(
            [
                lambda: c.generate(prompt(rng), max_new_tokens=100000),
                lambda: c.generate(prompt(rng), num_speculative_tokens=99, mode="sd"),
                lambda: c.generate(prompt(rng), temperature=-1.0),
                lambda: c.generate("", max_new_tokens=4),
                lambda: list(c.generate_stream(prompt(rng), max_new_tokens=10, tau=5.0, mode="csd")),
            ]
        )()
        return "invalid_accepted"
    except CalispecRpcError as e:
        return "grpc_" + e.code
    except ValueError:
        return "client_valueerror"


def http_disconnect(c, h, rng):
    body = dict(
        model=MODEL,
        prompt=prompt(rng),
        max_tokens=300,
        stream=True,
        ignore_eos=True,
        mode=rng.choice(MODES),
        n=rng.choice([1, 2]),
    )
    # own connection so the disconnect closes the socket
    with (
        httpx.Client(base_url=args.http, headers=AUTH) as hh,
        hh.stream("POST", "/v1/completions", json=body, timeout=120) as r,
    ):
        for i, _line in enumerate(r.iter_lines()):
            if i >= rng.randint(0, 4):
                break
    return "http_disconnected"


def http_unary_disconnect(c, h, rng):
    body = dict(model=MODEL, prompt=prompt(rng), max_tokens=300, ignore_eos=True, mode=rng.choice(MODES))
    try:
        with httpx.Client(base_url=args.http, headers=AUTH) as hh:
            hh.post("/v1/completions", json=body, timeout=rng.choice([0.2, 0.5, 1.0]))
        return "http_unary_finished"
    except httpx.TimeoutException:
        return "http_unary_client_timeout"


def http_invalid(c, h, rng):
    body = rng.choice(
        [
            dict(model=MODEL, prompt=prompt(rng), temperature=-1),
            dict(model=MODEL, prompt=prompt(rng), gamma=99),
            dict(model="nope", prompt="x"),
            dict(model=MODEL, prompt=prompt(rng), max_tokens=5000),
            dict(model=MODEL, prompt=prompt(rng) * 40, max_tokens=900),
            dict(model=MODEL, prompt=[]),
            dict(model=MODEL, prompt=prompt(rng), n=17),
        ]
    )
    r = h.post("/v1/completions", json=body, timeout=30)
    return f"http_{r.status_code}"


NORMAL = [(grpc_unary, 22), (grpc_stream, 23), (http_completion, 44), (http_chat, 1)]
ABUSE = [
    (grpc_cancel, 1.4),
    (grpc_deadline, 1.4),
    (grpc_invalid, 1),
    (http_disconnect, 1.4),
    (http_unary_disconnect, 0.7),
    (http_invalid, 1),
]
KINDS = NORMAL + ABUSE
if args.only:
    KINDS = [(f, w) for f, w in KINDS if f.__name__ in args.only.split(",")]
MODEL = httpx.get(args.http + "/v1/models", headers=AUTH).json()["data"][0]["id"]
ROWS = open(args.rows, "a") if args.rows else None  # noqa: SIM115 (appended to for the whole run)
if ROWS is not None and ROWS.tell() == 0:
    ROWS.write("t,kind\n")
stop = time.time() + args.duration


def worker(i):
    rng = random.Random(i * 7919 + int(time.time()))
    c = CalispecClient(args.grpc)
    h = httpx.Client(base_url=args.http, headers=AUTH)
    while time.time() < stop:
        f = rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
        try:
            res = f(c, h, rng)
        except CalispecRpcError as e:
            res = "ERR_grpc_" + e.code
        except httpx.HTTPStatusError as e:
            res = f"ERR_http_{e.response.status_code}"
        except Exception as e:
            res = "ERR_" + type(e).__name__
        bump(f"{f.__name__}:{res}")
    c.close()
    h.close()


ts = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(args.concurrency)]
for t in ts:
    t.start()
t0 = time.time()
while any(t.is_alive() for t in ts):
    time.sleep(60)
    with lock:
        snap = dict(stats)
    with open(args.log, "a") as f:
        f.write(json.dumps({"t": round(time.time() - t0), "stats": snap}) + "\n")
for t in ts:
    t.join()
print(json.dumps(dict(stats), indent=1))

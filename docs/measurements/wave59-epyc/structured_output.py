"""Structured output on the served pair: speed and acceptance of `ar`, `sd`, `csd` with a constraint and without.

Run against a running stack (`calispec up`, its gRPC address):
`.venv/bin/python docs/measurements/wave59-epyc/structured_output.py 127.0.0.1:50051 [ROUNDS]`.
Each prompt runs every variant in turn (interleaved, greedy, 128 new tokens at most), ROUNDS times (default 2); it
prints each request's tokens/s, acceptance and whether the output follows its constraint, then per variant the
sums (tokens over seconds) and the ratio to `ar` with the same constraint.
"""

import json
import platform
import re
import sys
import time

import torch

from calispec.client import CalispecClient
from calispec.types import OutputConstraint
from calispec_tools.bench.compare import cpu_flags

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "languages": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}
FUNCTION = {
    "type": "object",
    "properties": {
        "function_name": {"type": "string"},
        "parameters": {"type": "array", "items": {"type": "string"}},
        "returns": {"type": "string"},
        "code": {"type": "string"},
    },
    "required": ["function_name", "parameters", "returns", "code"],
}
TASKS = [
    (
        "person",
        "Describe a fictional software engineer as JSON with keys name, age and languages.",
        OutputConstraint.of(json=PERSON),
    ),
    (
        "function",
        "Write a Python function that checks whether a number is prime. Answer as JSON with keys function_name, "
        "parameters, returns and code.",
        OutputConstraint.of(json=FUNCTION),
    ),
    ("json_object", "List three sorting algorithms and their time complexity as a JSON object.", None),
    ("date", "When did the Apollo 11 mission land on the Moon? Answer with the date as YYYY-MM-DD.", None),
]
DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"


def constraint_of(name, given):
    if given is not None:
        return given
    return OutputConstraint.of(json_object=True) if name == "json_object" else OutputConstraint.of(regex=DATE)


def follows(name, text):
    if name == "date":
        return re.fullmatch(DATE, text) is not None
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def main() -> None:
    address = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    print(f"{platform.node()} flags {' '.join(cpu_flags())}; torch {torch.__version__}; {time.strftime('%F %T')}")
    variants = [(mode, constrained) for constrained in (True, False) for mode in ("ar", "sd", "csd")]
    totals: dict = {}
    with CalispecClient(address, timeout=600) as client:
        for r in range(rounds):
            for name, prompt, given in TASKS:
                for mode, constrained in variants:
                    constraint = constraint_of(name, given) if constrained else None
                    messages = [{"role": "user", "content": prompt}]
                    start = time.perf_counter()
                    result = client.chat(messages, max_new_tokens=128, mode=mode, constraint=constraint)
                    seconds = time.perf_counter() - start
                    s = result.stats
                    key = (mode, constrained)
                    t = totals.setdefault(key, [0, 0.0, 0, 0])
                    t[0] += s.emitted
                    t[1] += seconds
                    t[2] += s.drafted
                    t[3] += s.accepted
                    ok = follows(name, result.text) if constrained else "-"
                    print(
                        f"round {r + 1} {name:11s} {mode:3s} {'constrained' if constrained else 'free':11s} "
                        f"{s.emitted:3d} tokens {s.emitted / seconds:6.2f} tok/s acc {s.acceptance_rate:.3f} "
                        f"rescued {s.rescued:2d} finish {result.finish_reason:6s} follows {ok} "
                        f"{result.text[:60]!r}",
                        flush=True,
                    )
    print("totals: tokens / seconds, ratio to ar of the same kind, acceptance")
    for (mode, constrained), (tokens, seconds, drafted, accepted) in totals.items():
        ar_tokens, ar_seconds, _, _ = totals[("ar", constrained)]
        rate = tokens / seconds
        print(
            f"  {mode:3s} {'constrained' if constrained else 'free':11s} {rate:6.2f} tok/s "
            f"x ar {rate / (ar_tokens / ar_seconds):.2f} acceptance {accepted / drafted if drafted else 0:.3f}"
        )


if __name__ == "__main__":
    main()

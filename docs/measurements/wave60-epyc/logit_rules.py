"""Logit rules on the served pair: speed and acceptance of `ar`, `sd`, `csd` with typical penalties and without.

Run against a running stack (`calispec up`, its gRPC address):
`.venv/bin/python docs/measurements/wave60-epyc/logit_rules.py 127.0.0.1:50051 [ROUNDS]`.
Each prompt runs every variant in turn (interleaved, greedy, 128 new tokens at most), ROUNDS times (default 2); it
prints each request's tokens/s, acceptance and whether `sd` wrote `ar`'s tokens under the same rules, then per
variant the sums (tokens over seconds) and the ratio to `ar` with the same rules.
"""

import platform
import sys
import time

import torch

from calispec.client import CalispecClient
from calispec_tools.bench.compare import cpu_flags

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Explain in a short paragraph why the sky is blue.",
    "Write a JavaScript function that removes duplicate values from an array.",
    "List five tips for writing clear technical documentation.",
]
# what clients commonly send (LangChain and chat front ends expose these three)
RULES = {"repetition_penalty": 1.1, "frequency_penalty": 0.3, "presence_penalty": 0.3}


def main() -> None:
    address = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    print(f"{platform.node()} flags {' '.join(cpu_flags())}; torch {torch.__version__}; {time.strftime('%F %T')}")
    print(f"rules: {RULES}")
    variants = [(mode, ruled) for ruled in (True, False) for mode in ("ar", "sd", "csd")]
    totals: dict = {}
    with CalispecClient(address, timeout=600) as client:
        for r in range(rounds):
            for p, prompt in enumerate(PROMPTS):
                ar_tokens: dict[bool, list[int]] = {}
                for mode, ruled in variants:
                    messages = [{"role": "user", "content": prompt}]
                    start = time.perf_counter()
                    result = client.chat(messages, max_new_tokens=128, mode=mode, **(RULES if ruled else {}))
                    seconds = time.perf_counter() - start
                    s = result.stats
                    t = totals.setdefault((mode, ruled), [0, 0.0, 0, 0, 0])
                    t[0] += s.emitted
                    t[1] += seconds
                    t[2] += s.drafted
                    t[3] += s.accepted
                    t[4] += s.rejections
                    if mode == "ar":
                        ar_tokens[ruled] = list(result.token_ids)
                    same = "-" if mode != "sd" else list(result.token_ids) == ar_tokens[ruled]
                    print(
                        f"round {r + 1} prompt {p} {mode:3s} {'rules' if ruled else 'free':5s} "
                        f"{s.emitted:3d} tokens {s.emitted / seconds:6.2f} tok/s acc {s.acceptance_rate:.3f} "
                        f"rescued {s.rescued:2d} events {s.rejections:2d} sd==ar {same} {result.text[:50]!r}",
                        flush=True,
                    )
    print("totals: tokens / seconds, ratio to ar with the same rules, acceptance, memory events")
    for (mode, ruled), (tokens, seconds, drafted, accepted, events) in totals.items():
        ar_tokens_total, ar_seconds, *_ = totals[("ar", ruled)]
        rate, ar_rate = tokens / seconds, ar_tokens_total / ar_seconds
        print(
            f"  {mode:3s} {'rules' if ruled else 'free':5s} {rate:6.2f} tok/s x ar {rate / ar_rate:.2f} "
            f"acceptance {accepted / drafted if drafted else 0:.3f} events {events}"
        )


if __name__ == "__main__":
    main()

"""The cost of one round's logit rules on the target's [G+1, V] float32 logits (V = 151,936), 2 threads.

`.venv/bin/python docs/measurements/wave60-epyc/apply_cost.py` (no model needed).
"""

import time

import torch

from calispec_core.logit_rules import LogitRules, SessionRules

V = 151936
RULES = {
    "penalties (rep 1.1, freq 0.3, pres 0.3)": LogitRules.of(
        repetition_penalty=1.1, frequency_penalty=0.3, presence_penalty=0.3
    ),
    "logit_bias (10 ids)": LogitRules.of(logit_bias={i: 1.0 for i in range(10)}),
    "min_p 0.05 (sampling)": LogitRules.of(min_p=0.05),
}


def main() -> None:
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    for (name, rules), prompt_len in [(r, n) for r in RULES.items() for n in (300, 16000)]:
        prompt = torch.randint(0, V, (prompt_len,), generator=g).tolist()
        session = SessionRules(rules, prompt, V, torch.device("cpu"))
        for out_len in (100, 4000):
            output = torch.randint(0, V, (out_len,), generator=g).tolist()
            for width in (1, 7):
                logits = torch.randn(width, V, generator=g)
                drafts = output[: width - 1]
                for _ in range(3):
                    session.apply(logits.clone(), output, drafts, 0.7)
                n = 50
                start = time.perf_counter()
                for _ in range(n):
                    session.apply(logits.clone(), output, drafts, 0.7)
                applied = time.perf_counter()
                for _ in range(n):
                    logits.clone()
                copied = time.perf_counter()
                ms = ((applied - start) - (copied - applied)) / n * 1e3
                print(f"{name:40s} prompt {prompt_len:5d} output {out_len:5d} positions {width}: {ms:.2f} ms")


if __name__ == "__main__":
    main()

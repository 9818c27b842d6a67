"""A seeded sampling `sd` request alone, then beside 8 concurrent others: are its tokens the same? (wave 51)

python seeded_repro.py ADDRESS KEY_FILE: six seeds, one line each (the first differing token, or None)."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from calispec.client import CalispecClient, GenerationResult


def main(address: str, key_file: str) -> None:
    client = CalispecClient(address, timeout=300, token=Path(key_file).read_text().strip(), tls_ca="")

    def request(seed: int, prompt: str = "Once upon a time", tokens: int = 60) -> GenerationResult:
        return client.generate(
            prompt, max_new_tokens=tokens, mode="sd", temperature=1.0, seed=seed, num_speculative_tokens=4,
            ignore_eos=True,
        )  # fmt: skip

    same = 0
    for seed in range(6):
        alone = request(seed)
        with ThreadPoolExecutor(9) as pool:
            others = [pool.submit(request, 1000 + i, "The robot", 80) for i in range(8)]
            beside = pool.submit(request, seed).result()
            for other in others:
                other.result()
        first = next(
            (i for i, (a, b) in enumerate(zip(alone.token_ids, beside.token_ids, strict=True)) if a != b), None
        )
        same += first is None
        print(f"seed {seed}: first differing token {first}", flush=True)
    print(f"identical: {same} of 6")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""Wave 50: concurrent HTTP choices against a running stack (the probe that found the 40-thread wall).

Usage: python http_choices.py URL KEY_FILE N1,N2,... MAX_TOKENS LABEL
Sends one /v1/completions request per N (n = N choices each), all at once, sampled `ar` with `ignore_eos`, and prints
the statuses and the time the last one took. Before wave 50, 41 choices took ~8x what 40 took (every lockstep round
waited out its max wait for a member without a thread) and three requests of 16 choices x 200 tokens timed out.
"""

import asyncio
import sys
import time
from pathlib import Path

import httpx


async def main(url: str, key: str, choices: list[int], max_tokens: int, label: str) -> None:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    body = {"model": "target", "prompt": "def add(a, b):", "max_tokens": max_tokens, "temperature": 0.8,
            "ignore_eos": True, "mode": "ar"}  # fmt: skip
    async with httpx.AsyncClient(timeout=200, limits=httpx.Limits(max_connections=100)) as client:
        start = time.perf_counter()

        async def one(n: int) -> tuple[int, float]:
            response = await client.post(f"{url}/v1/completions", json={**body, "n": n}, headers=headers)
            return response.status_code, time.perf_counter() - start

        results = await asyncio.gather(*(one(n) for n in choices))
    statuses = sorted({status for status, _ in results})
    print(f"{label}: {sum(choices)} choices in {len(choices)} requests, max_tokens {max_tokens}: statuses {statuses}, "
          f"last done after {max(t for _, t in results):.1f} s")  # fmt: skip


if __name__ == "__main__":
    target, key_file, ns, tokens, name = sys.argv[1:6]
    asyncio.run(main(target, Path(key_file).read_text().strip(), [int(n) for n in ns.split(",")], int(tokens), name))

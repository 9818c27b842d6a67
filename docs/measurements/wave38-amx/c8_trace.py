"""Scratch (wave 38): concurrency-8 levels through a fresh stack with the coordinator's DEBUG round log, prefix cache
off or on, then the round lines summed (what a level's rounds cost and waited).

`python docs/measurements/wave38-amx/c8_trace.py PREFIX_CACHE_TOKENS OUT_DIR [MODES]`: a stack as `bench compare`
starts it (shipped calibration, bf16 target, int8 draft, the coordinator's default lockstep rule) with
`--prefix-cache-tokens PREFIX_CACHE_TOKENS`, one warm-up request, then one 32-request level (96 tokens, `bench
compare`'s four prompts, 8 clients) per mode of MODES (default csd,ar,csd); the services' logs stay in OUT_DIR.
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

from calispec.client import CalispecClient
from calispec_tools.bench.compare import CompareConfig, load_level
from calispec_tools.bench.pair import PROMPTS
from calispec_tools.cli import ensure_pulled_pair
from calispec_tools.models.registry import PAIRS, chat_prompt
from calispec_tools.shipped_calibration import chosen_lambdas, shipped_file
from calispec_tools.stack import LocalStack, StackConfig, default_draft_dtype

ROUND = re.compile(
    r"round: gamma (\d+) drafted (\d+) accepted (\d+) .*? batch (\d+) \| predicted [\d.]+ ms, measured ([\d.]+) ms "
    r"\(target forward ([\d.]+), draft forwards ([\d.]+);.*waited ([\d.]+) ms \(([\d.]+) at the start\)"
)


def summarise(log: Path, since: int) -> str:
    rows = [m.groups() for line in log.read_text().splitlines()[since:] if (m := ROUND.search(line))]
    if not rows:
        return "no round lines"
    gamma, drafted, accepted, batch, measured, target, draft, _waited, start = zip(*rows, strict=True)
    ints = [list(map(int, c)) for c in (gamma, drafted, accepted, batch)]
    floats = [list(map(float, c)) for c in (measured, target, draft, start)]
    mean, median = statistics.mean, statistics.median
    full = sum(b == 8 for b in ints[3]) / len(rows)
    return (
        f"{len(rows)} row-rounds: drafted {mean(ints[1]):.2f} accepted {mean(ints[2]):.2f} a row, "
        f"verify batch mean {mean(ints[3]):.2f} (rows at 8: {full:.0%}), round median {median(floats[0]):.0f} ms "
        f"(target forward {median(floats[1]):.0f}, draft forwards {median(floats[2]):.0f}), "
        f"wait at the round start mean {mean(floats[3]):.0f} ms"
    )


def main() -> None:
    prefix, out = int(sys.argv[1]), Path(sys.argv[2])
    modes = (sys.argv[3] if len(sys.argv) > 3 else "csd,ar,csd").split(",")
    draft, target = ensure_pulled_pair("qwen-coder")
    config = StackConfig(
        draft_model=draft, target_model=target, memory_db=out / "memory.db", log_dir=out / "logs",
        coordinator_port=0, target_port=0, draft_port=0, memory_port=0, draft_dtype=default_draft_dtype("auto"),
        prefix_cache_tokens=prefix, calibration_file=shipped_file("qwen-coder"),
        calibration_lambdas=chosen_lambdas("qwen-coder", True), log_level="DEBUG",
    )  # fmt: skip
    texts = [t for ts in PROMPTS.values() for t in ts]
    prompts = [chat_prompt(PAIRS["qwen-coder"], texts[i % len(texts)]) for i in range(4)]
    with LocalStack(config) as stack:
        with CalispecClient(stack.coordinator_address, timeout=900) as client:
            client.generate(prompts[0], max_new_tokens=8)
        log = config.log_dir / "coordinator.log"
        for mode in modes:
            since = len(log.read_text().splitlines())
            r = load_level(stack.coordinator_address, mode, 8, CompareConfig(prompts, 96, None, [8], 32))
            rate, full = r["tokens_per_s"], r["full_concurrency_tokens_per_s"]
            head = (
                f"prefix cache {prefix}, {mode}: {rate:.2f} tok/s (full {full:.2f}), acceptance {r['acceptance']:.3f}"
            )
            print(f"{head}; {summarise(log, since)}", flush=True)


if __name__ == "__main__":
    main()

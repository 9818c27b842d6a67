"""The coordinator's pattern alone: prompts of wave 56's soak generator encoded on anyio worker threads (6 at a time,
as its HTTP rounds run), with the tokenizer as loaded before (AutoTokenizer) or by the fixed coordinator._tokenizer.
usage: anyio_prompts.py cached|fixed REQUESTS"""

import random
import string
import sys
from pathlib import Path

import anyio

sys.path.insert(0, "/tmp/w57/soak")
TARGET = Path("/work/main/.cache/tiny-a2e4fbb4c962/target")
if sys.argv[1] == "fixed":
    from coordinator.server import _tokenizer

    tok = _tokenizer(TARGET)
else:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TARGET), local_files_only=True)
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
rng = random.Random(0)


def prompt():
    return " ".join(
        "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 8)))
        if rng.random() < 0.35
        else rng.choice(WORDS)
        for _ in range(rng.randint(4, 60))
    )


def anon():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon")) / 1024


N = int(sys.argv[2])


async def main():
    limiter = anyio.CapacityLimiter(6)
    done = 0
    a0 = anon()

    async def one(p):
        nonlocal done
        await anyio.to_thread.run_sync(tok.encode, p, limiter=limiter)
        await anyio.sleep(rng.random() * 0.01)
        done += 1
        if done % (N // 4) == 0:
            print(f"  {sys.argv[1]}: {done} prompts: RssAnon +{anon() - a0:.1f} MB", flush=True)

    async with anyio.create_task_group() as tg:
        for i in range(N):
            tg.start_soon(one, prompt())
            if i % 6 == 5:
                await anyio.sleep(0.002)


anyio.run(main)

"""tokenizers' per-thread BPE cache: RssAnon while T live threads have each encoded N distinct random words, and after
they exit. usage: bpe_alive.py T N [CAPACITY]"""

import random
import string
import sys
import threading

from transformers import AutoTokenizer

T, N = int(sys.argv[1]), int(sys.argv[2])
tok = AutoTokenizer.from_pretrained("/work/main/.cache/tiny-a2e4fbb4c962/target")
if len(sys.argv) > 3:
    tok.backend_tokenizer.model._resize_cache(int(sys.argv[3]))


def anon():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon")) / 1024


done = threading.Barrier(T + 1)
leave = threading.Event()


def work(seed):
    rng = random.Random(seed)
    for _ in range(N // 20):
        tok.encode(
            " ".join("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 8))) for _ in range(20))
        )
    done.wait()
    leave.wait()


a0 = anon()
ths = [threading.Thread(target=work, args=(i,)) for i in range(T)]
for t in ths:
    t.start()
done.wait()
a1 = anon()
leave.set()
for t in ths:
    t.join()
print(
    f"T={T} words/thread={N} cap={sys.argv[3] if len(sys.argv) > 3 else 'default(10000)'}: "
    f"+{a1 - a0:.1f} MB with the threads alive, +{anon() - a0:.1f} MB after they exit"
)

"""Teacher-forced forwards and the heap: both served models over the shipped corpus's text, as in wave 42's
teacher_forward_budget.py, under one of three allocator settings (one per process).

`python teacher_heap_first.py none|heap|thp [repeats]`, run on wave 42's code (62ed854: load_pair does not yet touch
the heap, Int8Linear as wave 42 shipped it):
- none: glibc's defaults (what `calispec calibrate` ran with through wave 42);
- heap: glibc told to keep freed memory for reuse (one arena, no mmap'd chunks, no trimming), via mallopt;
- thp: torch's CPU allocator asked for transparent huge pages (THP_MEM_ALLOC_ENABLE=1, set before torch loads).
Prints each model's time, system time and minor page faults per repeat.
"""

import ctypes
import os
import resource
import sys
import time
from pathlib import Path

variant = sys.argv[1]
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 2
if variant == "thp":
    os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
if variant == "heap":
    libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
    assert libc.mallopt(M_ARENA_MAX, 1) and libc.mallopt(M_MMAP_MAX, 0)
    assert libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)

import torch  # noqa: E402

from calispec_core.limits import INT8_SPLIT  # noqa: E402
from calispec_tools.bench.calibration import text_documents  # noqa: E402
from calispec_tools.calibrate import teacher  # noqa: E402
from calispec_tools.calibrate.corpus import encode, windows  # noqa: E402
from calispec_tools.calibrate.job import load_pair  # noqa: E402

MODELS = Path.home() / ".cache/calispec/models/qwen-coder"
draft, target = load_pair(MODELS / "draft", MODELS / "target", "auto", "auto", "int8", INT8_SPLIT)
rows = [w for d in text_documents() for w in windows(encode(target.tokenizer, d.text), 512)]
print(f"variant {variant}: threads {torch.get_num_threads()}, {len(rows)} rows, {sum(map(len, rows))} tokens")
results = {}
for _ in range(repeats):
    for name, runner in (("draft int8", draft), ("target bf16", target)):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        predictions = teacher.greedy_predictions(runner, rows, 512)
        seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        assert results.setdefault(name, predictions) == predictions, "predictions moved between repeats"
        print(f"{variant:4s} {name:11s} {seconds:5.1f} s (system {after.ru_stime - usage.ru_stime:4.1f} s, "
              f"{after.ru_minflt - usage.ru_minflt:8d} page faults)", flush=True)  # fmt: skip
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
digest = hash(tuple(tuple(p) for name in sorted(results) for p in results[name]))
print(f"{variant:4s} peak RSS {peak:.1f} GiB, predictions digest {digest}")

"""Teacher-forced forwards by size: both served models over the shipped corpus's text, FORWARD_TOKENS tokens a forward.

`python teacher_forward_budget.py 8192 512 ...`: for each budget in turn, the int8 draft (split) and the bf16 target
each predict every position of the corpus's 19 text windows (13 packed sequences of 512 tokens), timed with the
process's system time and minor page faults. 8,192 puts all 13 sequences in one forward (the code before wave 42).
"""

import resource
import sys
import time
from pathlib import Path

import torch

from calispec_core.limits import INT8_SPLIT
from calispec_tools.bench.calibration import text_documents
from calispec_tools.calibrate import teacher
from calispec_tools.calibrate.corpus import encode, windows
from calispec_tools.calibrate.job import load_pair

MODELS = Path.home() / ".cache/calispec/models/qwen-coder"
draft, target = load_pair(MODELS / "draft", MODELS / "target", "auto", "auto", "int8", INT8_SPLIT)
rows = [w for d in text_documents() for w in windows(encode(target.tokenizer, d.text), 512)]
print(f"threads {torch.get_num_threads()}, {len(rows)} rows, {sum(map(len, rows))} tokens", flush=True)
for budget in [int(a) for a in sys.argv[1:]]:
    teacher.FORWARD_TOKENS = budget
    for name, runner in (("draft int8", draft), ("target bf16", target)):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        teacher.greedy_predictions(runner, rows, 512)
        seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        print(f"budget {budget:5d} {name:11s} {seconds:5.1f} s (system {after.ru_stime - usage.ru_stime:4.1f} s, "
              f"{after.ru_minflt - usage.ru_minflt:8d} page faults)", flush=True)  # fmt: skip

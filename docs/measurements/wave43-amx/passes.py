"""Both served models' teacher-forced passes over the shipped corpus's text, timed (shared by teacher_heap*.py)."""

import resource
import time
from pathlib import Path

import torch

from calispec_core.limits import INT8_SPLIT
from calispec_tools.bench.calibration import text_documents
from calispec_tools.calibrate import teacher
from calispec_tools.calibrate.corpus import encode, windows
from calispec_tools.calibrate.job import load_pair

MODELS = Path.home() / ".cache/calispec/models/qwen-coder"


def run_passes(variant: str, repeats: int) -> None:
    """Load the served pair (int8 draft with `split`, bf16 target); each model predicts every position of the
    corpus's text windows (512 tokens a forward), `repeats` times; prints time, system time, minor page faults, and
    a digest of every prediction (equal digests: the same predictions)."""
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
            print(f"{variant:6s} {name:11s} {seconds:5.1f} s (system {after.ru_stime - usage.ru_stime:4.1f} s, "
                  f"{after.ru_minflt - usage.ru_minflt:8d} page faults)", flush=True)  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    digest = hash(tuple(tuple(p) for name in sorted(results) for p in results[name]))
    print(f"{variant:6s} peak RSS {peak:.1f} GiB, predictions digest {digest}")

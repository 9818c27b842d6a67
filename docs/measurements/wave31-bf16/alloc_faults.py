"""Scratch (wave 31): time and page faults of `torch.zeros` of 53 MB ([8, 11, V] float32) and 6.7 MB ([11, V]) on the
compute thread, five times, in a bare process or one with the bf16 target loaded, with glibc's defaults or the
mallopt settings of allocator_rounds.py's `keep` (one arena, 256 MB mmap and 512 MB trim thresholds).
`python alloc_faults.py none|mallopt bare|loaded`."""

import ctypes
import resource
import sys
import time

if sys.argv[1] == "mallopt":
    libc = ctypes.CDLL("libc.so.6")
    print("mallopt", libc.mallopt(-8, 1), libc.mallopt(-3, 256 << 20), libc.mallopt(-1, 512 << 20))

from pathlib import Path

import torch

from calispec_core.compute import compute_thread
from calispec_core.modeling import ModelRunner, ModelSpec

TARGET = Path.home() / ".cache/calispec/models/qwen-coder/target"


def main(_: object) -> None:
    for shape in ((8, 11, 151936), (11, 151936)):
        runs = []
        for _ in range(5):
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            block = torch.zeros(*shape)
            elapsed = (time.perf_counter() - start) * 1e3
            runs.append(f"{elapsed:.1f}ms/{resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults}flt")
            del block
        print(sys.argv[1], sys.argv[2], shape, runs)


if sys.argv[2] == "loaded":
    runner = ModelRunner(ModelSpec(TARGET, dtype="bfloat16", device="cpu", threads=2))
else:
    torch.set_num_threads(2)
compute_thread().run(main, None)

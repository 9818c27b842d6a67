"""glibc's heap told to keep what a calibration process frees, so its forwards stop faulting pages in afresh.

A teacher-forced forward allocates the same large tensors every time: the output layer's logits alone are 311 MB
for 512 rows of the int8 draft (float32) and 155 MB for the bf16 target. glibc serves blocks that large with a
fresh mmap and unmaps them on free, and smaller ones from heaps it trims back to the kernel, so every forward
faults its memory in again, page by page: over the shipped corpus's text 1.6 M faults for the draft and 0.46 M for
the target, 4-7 s of system time in 29-31 s (docs/measurements/wave43-amx/teacher-heap.txt, `before`). One arena
that never maps or trims reuses the same pages instead; the peak resident size grows (8.8 GiB → 9.1-10.9 there) and
nothing freed goes back to the system until the process ends. The numbers computed do not change. Every process
that loads a pair for calibration asks (`load_pair`: `calispec calibrate`, its Ray workers, `bench calibration`,
eval's calibration study); a serving process does not: its forwards are a few rows.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8  # glibc's malloc.h
NEVER_TRIM = 2**31 - 1  # mallopt takes an int


def keep_freed_memory() -> bool:
    """Make this process's malloc keep freed memory for reuse (glibc only); True when every setting took.

    Call it before the threads that compute start (the compute thread starts with the first model load): a
    thread's arena is chosen at its first allocation, and only the main arena obeys "no mmap" for large blocks."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # this process's C library
    except (OSError, AttributeError):
        return False
    settings = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, NEVER_TRIM))
    return all(mallopt(option, value) == 1 for option, value in settings)

"""Teacher-forced forwards and the heap: both served models over the shipped corpus's text, as in wave 42's
teacher_forward_budget.py, under one of three allocator settings (one per process).

`python teacher_heap_first.py none|heap|thp [repeats]`, run on wave 42's code (62ed854: load_pair does not yet touch
the heap, Int8Linear as wave 42 shipped it):
- none: glibc's defaults (what `calispec calibrate` ran with through wave 42);
- heap: glibc told to keep freed memory for reuse (one arena, no mmap'd chunks, no trimming), via mallopt;
- thp: torch's CPU allocator asked for transparent huge pages (THP_MEM_ALLOC_ENABLE=1, set before torch loads).
Prints each model's time, system time and minor page faults per repeat (passes.py, which this wave factored out of
both scripts afterwards: the file's lines pad the variant name to 4 characters, passes.py to 6).
"""

import ctypes
import os
import sys

variant = sys.argv[1]
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 2
if variant == "thp":
    os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
if variant == "heap":
    libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
    assert libc.mallopt(M_ARENA_MAX, 1) and libc.mallopt(M_MMAP_MAX, 0)
    assert libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)

from passes import run_passes  # noqa: E402  (torch loads here, after mallopt)

run_passes(variant, repeats)

"""Fixed glibc malloc thresholds for a long-running process that allocates on many threads.

glibc raises its mmap threshold (and with it the trim threshold, to twice that) each time a freed block was mmapped,
up to 32 MB. In the coordinator one 1.84 MB block freed at start-up took the trim threshold to 3.67 MB, and its 15
per-thread arenas then kept up to that much free memory each at their tops: its RSS climbed 0.2-0.3 MB a minute under
HTTP traffic with the memory in use flat, and `malloc_trim` does not shrink a per-thread arena's top. Setting both
thresholds turns the adjustment off (glibc's `no_dyn_threshold`), so the arenas give back what is free past 128 KiB:
the climb fell by ~70 % for ~4x the (cheap) mmap calls (wave 58; docs/robustness.md, docs/measurements/wave58-epyc/).
"""

from __future__ import annotations

import ctypes
import platform

THRESHOLD_BYTES = 128 * 1024  # glibc's own starting value for both
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def fix_malloc_thresholds(threshold_bytes: int = THRESHOLD_BYTES) -> bool:
    """Fix this process's mmap and trim thresholds (glibc only); whether both were set. Call it early: blocks
    allocated before keep where they are."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, threshold_bytes) == 1 and mallopt(_M_TRIM_THRESHOLD, threshold_bytes) == 1

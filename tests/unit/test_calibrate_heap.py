"""A calibration process's heap keeps freed memory (calispec_tools/calibrate/heap.py): a thread started after the
call, as the compute thread is, allocates a forward's large temporaries again without faulting their pages in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# In a fresh interpreter (mallopt is process-wide), torch loaded first as in load_pair: a worker thread runs a
# forward-like step (temporaries of three sizes, 8-160 MB, made and freed in turn) once, then three more times, and
# prints whether the settings took and the minor page faults of those three.
PROBE = """
import resource, sys, threading
import torch
from calispec_tools.calibrate.heap import keep_freed_memory
took = keep_freed_memory() if sys.argv[1] == "keep" else None
def step():
    h = torch.ones(2_000_000)
    for _ in range(4):
        up = torch.ones(10_000_000)
        h = h + up[:2_000_000]
        del up
    logits = torch.ones(40_000_000)
    return float(logits[0] + h[0])
def repeated_step_faults(out):
    step()
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for _ in range(3):
        step()
    out.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
out = []
worker = threading.Thread(target=repeated_step_faults, args=(out,))
worker.start()
worker.join()
print(took, out[0])
"""


def probe(mode: str) -> tuple[str, int]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the worker fills every tensor itself: the faults are its own
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, env=env)
    took, faults = done.stdout.split()
    return took, int(faults)


def default_heap_maps_anew() -> bool:
    """glibc's own malloc with 4 KiB pages: no preloaded allocator, no tunables, no huge pages by default."""
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    always = thp.exists() and "[always]" in thp.read_text()
    return not (always or os.environ.get("LD_PRELOAD") or os.environ.get("GLIBC_TUNABLES"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.skipif(not default_heap_maps_anew(), reason="another allocator, tunables or huge pages: other faults")
def test_a_repeated_forwards_temporaries_reuse_their_pages() -> None:
    took, kept = probe("keep")
    _, default = probe("default")
    assert took == "True"
    assert default > 3 * 40_000_000 * 4 // 4096  # glibc's default: at least the logits mapped anew each step
    assert kept * 4 < default  # measured here: 1-39 thousand against 246 thousand

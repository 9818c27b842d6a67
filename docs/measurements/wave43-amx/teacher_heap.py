"""Teacher-forced forwards before and after wave 43: both served models over the shipped corpus's text, as in
wave 42's teacher_forward_budget.py (FORWARD_TOKENS = 512), one variant per process.

`python teacher_heap.py before|heap|peaks|now [repeats]`:
- before: wave 42's code (glibc's default heap; Int8Linear's outlier split by abs() and a masked copy; fbgemm);
- heap: wave 42's Int8Linear, the heap keeping freed memory (load_pair calls keep_freed_memory);
- peaks: and Int8Linear's peaks from amax/amin, its outlier rows zeroed in place (still fbgemm for every call);
- now: this wave's code: and int8 calls over 128 rows or more on oneDNN's integer GEMM, the output layer's argmax
  straight from its accumulators (calispec_core/int8_gemm.py).
Prints each model's time, system time and minor page faults per repeat, and a digest of every prediction.
"""

import contextlib
import sys

import torch
from passes import run_passes

from calispec_core import int8_outliers
from calispec_core.argmax import argmax_last
from calispec_core.int8_outliers import OUTLIER_RATIO, Int8Linear
from calispec_tools.calibrate import job, teacher


def wave42_forward(self: Int8Linear, x: torch.Tensor) -> torch.Tensor:
    """Int8Linear.forward as wave 42 shipped it."""
    if not int8_outliers._isolating.get():
        return super(Int8Linear, self).forward(x)
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] < 2:
        return super(Int8Linear, self).forward(x)
    peaks = rows.abs().amax(dim=-1)
    outliers = peaks > OUTLIER_RATIO * peaks.median()
    if not bool(outliers.any()):
        return super(Int8Linear, self).forward(x)
    out = super(Int8Linear, self).forward(rows.masked_fill(outliers[:, None], 0.0))
    apart = outliers.nonzero().squeeze(1)
    out[apart] = super(Int8Linear, self).forward(rows[apart])
    return out.view(*x.shape[:-1], self.out_features)


variant = sys.argv[1]
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 2
if variant == "before":
    job.keep_freed_memory = lambda: False
if variant in ("before", "heap"):
    Int8Linear.forward = wave42_forward
    teacher._greedy = lambda head, rows: argmax_last(head(rows))
if variant in ("before", "heap", "peaks"):
    teacher.int8_gemm.many_rows = contextlib.nullcontext
run_passes(variant, repeats)

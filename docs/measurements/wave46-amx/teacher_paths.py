"""Wave 46: both served models' teacher-forced passes over the shipped corpus's text (wave 43's passes.py), with the
int8 draft's many-row calls on each integer GEMM path of calispec_core/int8_gemm.py, one path per process.

`python docs/measurements/wave46-amx/teacher_paths.py int_mm|matmul [repeats]` (alone on the machine). Prints each
model's time, system time and page faults per repeat, and a digest of every prediction (equal digests: the same
predictions).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "wave43-amx"))

from passes import run_passes

from calispec_core import int8_gemm

if __name__ == "__main__":
    path = sys.argv[1]
    assert int8_gemm.exact_with(path), f"{path} is not exact here"
    int8_gemm.gemm_path = lambda: path  # every caller looks it up at call time
    run_passes(path, int(sys.argv[2]) if len(sys.argv) > 2 else 2)

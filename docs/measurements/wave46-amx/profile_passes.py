"""Wave 46: where a served model's teacher-forced pass spends its time (torch.profiler, top ops by self CPU time),
over 8 of the shipped corpus's text windows after 3 warm-up ones. Scratch, run alone, once per model:
`.venv/bin/python -W ignore docs/measurements/wave46-amx/profile_passes.py draft|target` (profile-*.txt; run before
teacher forcing's attention went per document). Without calibration's heap (load_pair's keep_freed_memory).
"""

import sys
import warnings
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from calispec_core import int8_gemm
from calispec_core.compute import compute_thread
from calispec_core.limits import INT8_SPLIT
from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_tools.bench.calibration import text_documents
from calispec_tools.calibrate import teacher
from calispec_tools.calibrate.corpus import encode, windows

warnings.filterwarnings("ignore")
MODELS = Path.home() / ".cache/calispec/models/qwen-coder"


def main(which: str) -> None:
    if which == "draft":
        runner = ModelRunner(ModelSpec(MODELS / "draft", "int8", "auto", int8_outliers=INT8_SPLIT))
        compute_thread().run(int8_gemm.prepare, runner.model)
    else:
        runner = ModelRunner(ModelSpec(MODELS / "target", "auto", "auto"))
    rows = [w for d in text_documents() for w in windows(encode(runner.tokenizer, d.text), 512)]
    teacher.greedy_predictions(runner, rows[:3], 512)

    def profiled() -> profile:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            teacher.greedy_predictions(runner, rows[:8], 512)
        return prof

    prof = compute_thread().run(profiled)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main(sys.argv[1])

"""Wave 46: the bf16 target's teacher-forced pass over the shipped corpus's text (512 tokens a forward), its Linear
products on each weight layout, in one process with calibration's heap (calispec_tools/calibrate/heap.py):
`packed16` (what the services and calibration use: oneDNN's blocked layout for ~16 rows, PACK_ROWS), `packed512`
(the layout oneDNN picks for 512 rows), `plain` (the [out, in] weight on oneDNN). Run alone:
`.venv/bin/python docs/measurements/wave46-amx/target_layouts.py [repeats]`. Prints seconds per pass and a digest
of the predictions per layout (bf16: another layout may round a near-tie otherwise).
"""

import sys
import time
import warnings
from pathlib import Path

import torch

from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_core.onednn_linear import OneDnnLinear
from calispec_tools.bench.calibration import text_documents
from calispec_tools.calibrate import teacher
from calispec_tools.calibrate.corpus import encode, windows
from calispec_tools.calibrate.heap import keep_freed_memory

warnings.filterwarnings("ignore")
TARGET = Path.home() / ".cache/calispec/models/qwen-coder/target"


def set_layout(model: torch.nn.Module, layout: str, packed16: dict[OneDnnLinear, torch.Tensor]) -> None:
    for layer in (m for m in model.modules() if isinstance(m, OneDnnLinear)):
        packed16.setdefault(layer, layer.packed)
        if layout == "plain":
            layer.use_packed = False
        else:
            wide = layout == "packed512"
            layer.packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight, 512) if wide else packed16[layer]
            layer.use_packed = True


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    keep_freed_memory()  # as calibration's load_pair: forwards reuse the heap's pages instead of faulting them in
    runner = ModelRunner(ModelSpec(TARGET, "auto", "auto"))
    rows = [w for d in text_documents() for w in windows(encode(runner.tokenizer, d.text), 512)]
    layers = sum(isinstance(m, OneDnnLinear) for m in runner.model.modules())
    print(f"target {runner.dtype}, threads {torch.get_num_threads()}, {layers} oneDNN layers, {len(rows)} rows, "
          f"{sum(map(len, rows))} tokens")  # fmt: skip
    packed16: dict[OneDnnLinear, torch.Tensor] = {}
    digests = {}
    for _ in range(repeats):
        for layout in ("packed16", "packed512", "plain"):
            set_layout(runner.model, layout, packed16)
            start = time.perf_counter()
            predictions = teacher.greedy_predictions(runner, rows, 512)
            seconds = time.perf_counter() - start
            digests[layout] = hash(tuple(tuple(p) for p in predictions))
            print(f"{layout:10s} {seconds:5.1f} s  digest {digests[layout]}", flush=True)


if __name__ == "__main__":
    main()

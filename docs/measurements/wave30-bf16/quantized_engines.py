"""Scratch (wave 30): the 0.5B draft's int8 dynamic Linear layers under each quantized engine torch offers.

`python quantized_engines.py`: one layer of each shape (q/o, k/v, MLP up, MLP down, output layer), 2 threads, ms
per call summed over the shapes, at 1, 8 and 16 rows. The draft service uses `fbgemm` (calispec_core/modeling.py).
"""

import time

import torch

SHAPES = [(896, 896), (896, 128), (896, 4864), (4864, 896), (896, 151936)]


def summed_ms(engine: str, rows: int) -> float:
    torch.backends.quantized.engine = engine
    total = 0.0
    for k, n in SHAPES:
        layer = torch.nn.Sequential(torch.nn.Linear(k, n))
        quantized = torch.ao.quantization.quantize_dynamic(layer, {torch.nn.Linear}, dtype=torch.qint8)
        x = torch.randn(rows, k)
        for _ in range(3):
            quantized(x)
        calls = 20 if n < 100_000 else 5
        start = time.perf_counter()
        for _ in range(calls):
            quantized(x)
        total += (time.perf_counter() - start) / calls * 1e3
    return total


def main() -> None:
    torch.set_num_threads(2)
    engines = [e for e in ("fbgemm", "x86", "onednn") if e in torch.backends.quantized.supported_engines]
    for rows in (1, 8, 16):
        print(f"rows {rows:2d}: " + ", ".join(f"{e} {summed_ms(e, rows):.2f} ms" for e in engines))


if __name__ == "__main__":
    main()

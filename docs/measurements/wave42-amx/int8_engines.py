"""Dynamic int8 Linear layers by quantised engine (fbgemm: what the draft serves on; onednn; x86), the 0.5B draft's
shapes at 1, 7 and 512 rows: ms a call, GOPS, largest error against the float32 Linear (scratch, alone)."""

import time

import torch

print(torch.backends.quantized.supported_engines)
torch.manual_seed(0)
for eng in ("fbgemm", "onednn", "x86"):
    if eng not in torch.backends.quantized.supported_engines:
        continue
    torch.backends.quantized.engine = eng
    for k, n in ((896, 4864), (4864, 896), (896, 151936)):
        lin = torch.nn.Linear(k, n, bias=False)
        q = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8)[0]
        for m in (1, 7, 512):
            x = torch.randn(m, k)
            q(x)
            reps = 20 if m < 100 else 3
            t = time.perf_counter()
            for _ in range(reps):
                y = q(x)
            dt = (time.perf_counter() - t) / reps
            err = (y - lin(x)).abs().max().item()
            print(
                f"{eng} k{k} n{n} m{m}: {dt * 1e3:.2f} ms  {2 * m * k * n / dt / 1e9:.0f} GOPS err {err:.3f}",
                flush=True,
            )

"""Wave 50 scratch: is a forward slower while the other model computes in another process?

Run twice at once: `python overlap.py target TARGET_DIR bfloat16 1 7 & python overlap.py draft DRAFT_DIR int8 1 1`.
Phases of 12 s by wall clock from a shared start: [0, P) the target alone, [P, 2P) both, [2P, 3P) the draft alone,
[3P, 4P) both again. Each process times its own forwards (those that end inside their phase). Files in /tmp/w50.
"""

import os
import statistics
import sys
import time

from calispec_core.forward_costs import context_session, forward_ms
from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_tools.bench.forward import SWITCH

PHASE_S = 12.0
WORK = "/tmp/w50"
role, path, dtype, threads, tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
runner = ModelRunner(ModelSpec(path, dtype=dtype, device="cpu", threads=threads, fp32_linear="default"))
if dtype == "bfloat16":
    SWITCH["packed"](runner.model)
sessions = [context_session(runner, 200, 11)]
forward_ms(runner, sessions, tokens)
open(f"{WORK}/ready-{role}", "w").close()
while not all(os.path.exists(f"{WORK}/ready-{r}") for r in ("target", "draft")):
    time.sleep(0.05)  # a scratch rendezvous between two processes
if role == "target":
    with open(f"{WORK}/t0.tmp", "w") as f:
        f.write(str(time.time() + 1.0))
    os.rename(f"{WORK}/t0.tmp", f"{WORK}/t0")
while not os.path.exists(f"{WORK}/t0"):
    time.sleep(0.05)
with open(f"{WORK}/t0") as f:
    t0 = float(f.read())
active = {"target": (0, 1, 3), "draft": (1, 2, 3)}[role]
times: dict[int, list[float]] = {}
while (phase := int((time.time() - t0) // PHASE_S)) < 4:
    if phase < 0 or phase not in active:
        time.sleep(0.01)
        continue
    ms = forward_ms(runner, sessions, tokens)
    if time.time() - t0 < (phase + 1) * PHASE_S:  # ended inside its phase
        times.setdefault(phase, []).append(ms)
label = {0: "alone", 1: "both", 2: "alone", 3: "both"}
for phase, values in sorted(times.items()):
    print(f"{role} threads {threads} tokens {tokens} phase {phase} {label[phase]}: n {len(values)} "
          f"median {statistics.median(values):.1f} ms")  # fmt: skip

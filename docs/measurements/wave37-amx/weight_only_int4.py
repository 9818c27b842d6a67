"""Micro-benchmark: one draft-sized stack of Linear weights (Qwen2.5-0.5B shapes) in fbgemm dynamic int8,
weight-only int8 (bf16 activations) and weight-only int4 (groupwise), M rows; prints ms per pass and error."""
import sys, time, torch
torch.manual_seed(0)
torch.set_num_threads(2)
H, I, L, V = 896, 4864, 24, 151936
shapes = [(H, 1152), (H, H), (H, 2 * I), (I, H)] * L + [(H, V)]

def int4_pack(w, group):  # w [N, K] float
    N, K = w.shape
    g = w.float().reshape(N, K // group, group)
    mx, mn = g.amax(-1), g.amin(-1)
    scales = ((mx - mn).clamp(min=1e-6) / 15)
    zeros = mn + scales * 8
    q = ((g - mn[..., None]) / scales[..., None]).round().clamp(0, 15).to(torch.int32).reshape(N, K)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    sz = torch.stack([scales, zeros], -1).transpose(0, 1).contiguous().to(torch.bfloat16)  # [K/g, N, 2]
    deq = ((q.reshape(N, K // group, group).float() - 8) * scales[..., None] + zeros[..., None]).reshape(N, K)
    return packed, sz, deq

mods = {}
ws = [torch.randn(o, i) * 0.02 for i, o in shapes]
lin = [torch.nn.Linear(i, o, bias=False) for i, o in shapes]
for l, w in zip(lin, ws):
    l.weight.data = w
q8 = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(*lin), {torch.nn.Linear}, dtype=torch.qint8)
int8wo = [(w.abs().amax(1) / 127, None) for w in ws]
int8wo = [((w / s[:, None]).round().to(torch.int8), s.to(torch.bfloat16)) for w, (s, _) in zip(ws, int8wo)]
packs = {g: [int4_pack(w, g) for w in ws] for g in (32, 128)}

def run_fbgemm(xs):
    return [m(x) for m, x in zip(q8, xs)]
def run_int8wo(xs):
    return [torch.ops.aten._weight_int8pack_mm(x, w, s) for (w, s), x in zip(int8wo, xs)]
def make_int4(g):
    def run(xs):
        return [torch.ops.aten._weight_int4pack_mm_for_cpu(x, p, g, sz) for (p, sz, _), x in zip(packs[g], xs)]
    return run
def bf16_ref(xs):
    return [x @ w.to(torch.bfloat16).t() for w, x in zip(ws, xs)]

for M in [int(a) for a in sys.argv[1:]] or [1, 7, 8, 16, 56]:
    xf = [torch.randn(M, i) for i, o in shapes]
    xb = [x.to(torch.bfloat16) for x in xf]
    # error check on the first layer
    ref = xf[2] @ packs[32][2][2].t()
    got = torch.ops.aten._weight_int4pack_mm_for_cpu(xb[2], packs[32][2][0], 32, packs[32][2][1]).float()
    err = (got - ref).abs().max().item() / ref.abs().max().item()
    res = {}
    for name, fn, xs in [("fbgemm int8", run_fbgemm, xf), ("int8 w-only", run_int8wo, xb), ("int4 g32", make_int4(32), xb), ("int4 g128", make_int4(128), xb)]:
        fn(xs)
        ts = []
        for _ in range(5):
            t = time.perf_counter(); fn(xs); ts.append(time.perf_counter() - t)
        res[name] = sorted(ts)[2] * 1e3
    print(f"M={M:3d} " + "  ".join(f"{k} {v:6.1f} ms" for k, v in res.items()) + f"  (int4 rel err {err:.3f})", flush=True)

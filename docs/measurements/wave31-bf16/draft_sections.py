"""Scratch (wave 31): wall time of each part of the int8 draft's one-token step (wave 30's layer form, timed by
perf_counter around each part; B = 1 and 8 sessions of 200 + 16·b cached tokens, 30 forwards). It ran on 8774664,
where HF's MLP still held `gate_proj` and `up_proj`; since 2c63c8d an int8 model's MLP is `FusedGateUpMLP`."""

import statistics
import time
from pathlib import Path

import torch

from calispec_core import lean_decoder as ld
from calispec_core.attention import grouped_attention
from calispec_core.compute import compute_thread
from calispec_core.forward_costs import context_session, forward_ms
from calispec_core.modeling import ModelRunner, ModelSpec

DRAFT = Path.home() / ".cache/calispec/models/qwen-coder/draft"
S = {}


def add(k, t):
    S[k] = S.get(k, 0) + t


pc = time.perf_counter


def run_layer(self, layer, rows, hidden, cos, sin, widths, masks):
    t0 = pc()
    module = layer.module
    attn, mlp = module.self_attn, module.mlp
    tokens, dim = hidden.shape[1], attn.head_dim
    normed = module.input_layernorm(hidden)
    query, key, value = layer.fused_qkv(normed).split((self.heads * dim, self.kv_heads * dim, self.kv_heads * dim), -1)
    t1 = pc()
    add("norm+qkv", t1 - t0)
    query = ld._rotate(query.view(1, tokens, self.heads, dim).transpose(1, 2), cos, sin)
    key = ld._rotate(key.view(1, tokens, self.kv_heads, dim).transpose(1, 2), cos, sin)
    value = value.view(1, tokens, self.kv_heads, dim).transpose(1, 2)
    t2 = pc()
    add("rotary", t2 - t1)
    outputs = []
    for row, q, k, v, mask in zip(
        rows, query.split(widths, 2), key.split(widths, 2), value.split(widths, 2), masks, strict=True
    ):
        a = pc()
        row.append(k, v)
        b = pc()
        add("append", b - a)
        outputs.append(grouped_attention(q, row.keys, row.values, mask, attn.scaling))
        add("sdpa", pc() - b)
    t3 = pc()
    attended = torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]
    attended = attended.transpose(1, 2).reshape(1, tokens, -1)
    t4 = pc()
    add("cat", t4 - t3)
    hidden = hidden + attn.o_proj(attended)
    t5 = pc()
    add("o_proj", t5 - t4)
    normed = module.post_attention_layernorm(hidden)
    g = mlp.gate_proj(normed)
    u = mlp.up_proj(normed)
    t6 = pc()
    add("norm+gate+up", t6 - t5)
    h = mlp.act_fn(g) * u
    t7 = pc()
    add("silu*", t7 - t6)
    out = hidden + mlp.down_proj(h)
    add("down", pc() - t7)
    return out


orig_fwd = ld.LeanDecoder.forward


def fwd(self, *a):
    t = pc()
    r = orig_fwd(self, *a)
    add("TOTAL forward", pc() - t)
    return r


def main(runner):
    ld.LeanDecoder._run_layer = run_layer
    ld.LeanDecoder.forward = fwd
    for rows in (1, 8):
        sessions = [context_session(runner, 200 + 16 * b, 2) for b in range(rows)]
        for _ in range(5):
            forward_ms(runner, sessions, 1)
        S.clear()
        n = 30
        w = [forward_ms(runner, sessions, 1) for _ in range(n)]
        print(f"batch {rows}: wall median {statistics.median(w):.1f} ms")
        layers = sum(v for k, v in S.items() if k != "TOTAL forward")
        for k, v in S.items():
            print(f"   {k:16s} {v / n * 1000:7.2f} ms")
        print(f"   outside layers   {(S['TOTAL forward'] - layers) / n * 1000:7.2f} ms")


runner = ModelRunner(ModelSpec(DRAFT, dtype="int8", device="cpu", threads=2, fp32_linear="default"))
compute_thread().run(main, runner)

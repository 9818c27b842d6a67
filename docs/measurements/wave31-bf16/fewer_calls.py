"""Scratch (wave 31): the int8 draft's one-token step with LeanDecoder as it is (gate/up fused, q and k rotated
together) against wave 30's form (gate and up two calls, q and k rotated apart), interleaved, same process.

`python fewer_calls.py`: B = 1 and 8 sessions (200 + 16·b cached tokens), median of 16 repetitions of 5 forwards
each (the first 2 dropped); also checks that both forms give bitwise the same logits.
"""

import statistics
from dataclasses import replace
from pathlib import Path

import torch

from calispec_core import lean_decoder
from calispec_core.batch_forward import forward_rows
from calispec_core.compute import compute_thread
from calispec_core.forward_costs import context_session, forward_ms
from calispec_core.modeling import ModelRunner, ModelSpec

DRAFT = Path.home() / ".cache/calispec/models/qwen-coder/draft"
NEW = lean_decoder.LeanDecoder._attention_inputs


def wave30_inputs(self, layer, normed, cos, sin):  # q, k, v split, then q and k rotated apart
    tokens, dim = normed.shape[1], layer.module.self_attn.head_dim
    query, key, value = layer.fused_qkv(normed).split((self.heads * dim, self.kv_heads * dim, self.kv_heads * dim), -1)
    query = lean_decoder._rotate(query.view(1, tokens, self.heads, dim).transpose(1, 2), cos, sin)
    key = lean_decoder._rotate(key.view(1, tokens, self.kv_heads, dim).transpose(1, 2), cos, sin)
    return query, key, value.view(1, tokens, self.kv_heads, dim).transpose(1, 2)


def use(decoder: lean_decoder.LeanDecoder, layers: list, form: str) -> None:
    decoder.layers = layers if form == "wave31" else [replace(layer, fused_gate_up=None) for layer in layers]
    lean_decoder.LeanDecoder._attention_inputs = NEW if form == "wave31" else wave30_inputs


def main(runner: ModelRunner) -> None:
    decoder, layers = runner.decoder, list(runner.decoder.layers)
    for rows in (1, 8):
        sessions = [context_session(runner, 200 + 16 * b, 2) for b in range(rows)]
        logits = {}
        for form in ("wave30", "wave31"):
            use(decoder, layers, form)
            out = forward_rows(runner, [s.cache for s in sessions], [s.pending() for s in sessions], [1] * rows)
            for s in sessions:
                s.cache.crop(-1)
            logits[form] = torch.cat(out)
        times = {"wave30": [], "wave31": []}
        for rep in range(16):
            for form in times:
                use(decoder, layers, form)
                ms = statistics.median(forward_ms(runner, sessions, 1) for _ in range(5))
                if rep >= 2:
                    times[form].append(ms)
        old, new = statistics.median(times["wave30"]), statistics.median(times["wave31"])
        same = torch.equal(logits["wave30"], logits["wave31"])
        print(f"batch {rows}: wave 30 form {old:.1f} ms, wave 31 form {new:.1f} ms, ratio {new / old:.3f}; logits bitwise equal: {same}")
    use(decoder, layers, "wave31")


if __name__ == "__main__":
    print(f"torch {torch.__version__}, 2 threads, int8 draft, lean pass")
    runner = ModelRunner(ModelSpec(DRAFT, dtype="int8", device="cpu", threads=2, fp32_linear="default"))
    compute_thread().run(main, runner)

"""Scratch (wave 31): the int8 draft's one-token step with LeanDecoder as it is (gate/up one call, q and k rotated
together) against wave 30's form (gate and up two calls, q and k rotated apart), interleaved, same process.

`python fewer_calls.py`: B = 1 and 8 sessions (200 + 16·b cached tokens), median of 16 repetitions of 5 forwards
each (the first 2 dropped); also checks that both forms give bitwise the same logits. Wave 30's MLPs are rebuilt
from each FusedGateUpMLP's stacked weight (its two halves, per-channel scales kept).
"""

import statistics
from pathlib import Path

import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

from calispec_core import lean_decoder
from calispec_core.batch_forward import forward_rows
from calispec_core.compute import compute_thread
from calispec_core.forward_costs import context_session, forward_ms
from calispec_core.modeling import ModelRunner, ModelSpec

DRAFT = Path.home() / ".cache/calispec/models/qwen-coder/draft"
NEW = lean_decoder.LeanDecoder._attention_inputs


class SeparateGateUp(torch.nn.Module):  # wave 30's MLP: gate and up two fbgemm calls
    def __init__(self, fused: torch.nn.Module) -> None:
        super().__init__()
        weight, bias = fused.gate_up_proj.weight(), fused.gate_up_proj.bias()
        width = weight.shape[0] // 2
        self.gate_proj, self.up_proj = (self._half(weight, bias, slice(i * width, (i + 1) * width)) for i in (0, 1))
        self.down_proj, self.act_fn = fused.down_proj, fused.act_fn

    @staticmethod
    def _half(weight: torch.Tensor, bias: torch.Tensor | None, rows: slice) -> DynamicQuantizedLinear:
        half = torch._make_per_channel_quantized_tensor(
            weight.int_repr()[rows], weight.q_per_channel_scales()[rows], weight.q_per_channel_zero_points()[rows], 0
        )
        layer = DynamicQuantizedLinear(half.shape[1], half.shape[0], dtype=torch.qint8)
        layer.set_weight_bias(half, None if bias is None else bias[rows])
        return layer


def wave30_inputs(self, layer, normed, cos, sin):  # q, k, v split, then q and k rotated apart
    tokens, dim = normed.shape[1], layer.module.self_attn.head_dim
    query, key, value = layer.fused_qkv(normed).split((self.heads * dim, self.kv_heads * dim, self.kv_heads * dim), -1)
    query = lean_decoder._rotate(query.view(1, tokens, self.heads, dim).transpose(1, 2), cos, sin)
    key = lean_decoder._rotate(key.view(1, tokens, self.kv_heads, dim).transpose(1, 2), cos, sin)
    return query, key, value.view(1, tokens, self.kv_heads, dim).transpose(1, 2)


def use(runner: ModelRunner, mlps: dict[str, list[torch.nn.Module]], form: str) -> None:
    for layer, mlp in zip(runner.model.model.layers, mlps[form], strict=True):
        layer.mlp = mlp
    lean_decoder.LeanDecoder._attention_inputs = NEW if form == "wave31" else wave30_inputs


def main(runner: ModelRunner) -> None:
    fused = [layer.mlp for layer in runner.model.model.layers]
    mlps = {"wave30": [SeparateGateUp(mlp) for mlp in fused], "wave31": fused}
    for rows in (1, 8):
        sessions = [context_session(runner, 200 + 16 * b, 2) for b in range(rows)]
        logits = {}
        for form in mlps:
            use(runner, mlps, form)
            out = forward_rows(runner, [s.cache for s in sessions], [s.pending() for s in sessions], [1] * rows)
            for s in sessions:
                s.cache.crop(-1)
            logits[form] = torch.cat(out)
        times = {form: [] for form in mlps}
        for rep in range(16):
            for form in mlps:
                use(runner, mlps, form)
                ms = statistics.median(forward_ms(runner, sessions, 1) for _ in range(5))
                if rep >= 2:
                    times[form].append(ms)
        old, new = statistics.median(times["wave30"]), statistics.median(times["wave31"])
        same = torch.equal(logits["wave30"], logits["wave31"])
        print(
            f"batch {rows}: wave 30 form {old:.1f} ms, wave 31 form {new:.1f} ms, ratio {new / old:.3f}; "
            f"logits bitwise equal: {same}"
        )
    use(runner, mlps, "wave31")


if __name__ == "__main__":
    print(f"torch {torch.__version__}, 2 threads, int8 draft, lean pass")
    runner = ModelRunner(ModelSpec(DRAFT, dtype="int8", device="cpu", threads=2, fp32_linear="default"))
    compute_thread().run(main, runner)

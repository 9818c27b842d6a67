"""Dynamic int8 Linear layers fused side by side: one fbgemm call instead of several (no gRPC here).

Each fbgemm call quantises its input activations and streams its own weights; layers that read the
same input (a decoder's q, k and v projections; its MLP's gate and up projections) can be one call
over their weights stacked by output channel. Every output channel keeps the scale and zero point its
own layer's weight had, so the int8 weights, the activation quantisation and the outputs are the same
bits as the separate calls' (tests/unit/test_lean_decoder.py). vLLM's `MergedColumnParallelLinear`
(`gate_up_proj`) is the same idea for float weights.
"""

from __future__ import annotations

import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

from calispec_core.int8_outliers import Int8Linear

MLP_CLASSES = ("LlamaMLP", "Qwen2MLP")  # down_proj(act_fn(gate_proj(x)) * up_proj(x)), HF's names
# torch's dynamic int8 Linear and ours (the same layer, outlier rows apart), never a subclass adding ops (LinearReLU)
INT8_LINEARS = (DynamicQuantizedLinear, Int8Linear)


class FusedGateUpMLP(torch.nn.Module):
    """A Llama/Qwen2 MLP whose int8 gate and up projections are one call (it replaces HF's MLP module,
    so their weights are held once): down_proj(act_fn(gate) * up), the same ops as HF's MLP."""

    def __init__(
        self, gate_up_proj: DynamicQuantizedLinear, down_proj: torch.nn.Module, act_fn: torch.nn.Module
    ) -> None:
        super().__init__()
        self.gate_up_proj = gate_up_proj  # [E] -> [2·I]: gate's outputs, then up's
        self.down_proj = down_proj
        self.act_fn = act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., E] -> [..., E]
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [..., I] each
        return self.down_proj(self.act_fn(gate) * up)


def fuse_gate_up_mlps(model: torch.nn.Module) -> int:
    """Replace every Llama/Qwen2 MLP of `model` whose gate and up are dynamic int8 Linears of one shape by a
    `FusedGateUpMLP`; returns how many were replaced."""
    replaced = 0
    for parent in list(model.modules()):
        for name, mlp in list(parent.named_children()):
            fused = _fused_gate_up(mlp) if type(mlp).__name__ in MLP_CLASSES else None
            if fused is not None:
                setattr(parent, name, FusedGateUpMLP(fused, mlp.down_proj, mlp.act_fn))
                replaced += 1
    return replaced


def _fused_gate_up(mlp: torch.nn.Module) -> DynamicQuantizedLinear | None:
    """gate and up in one call, if both are dynamic int8 Linears of one shape (`chunk(2)` splits them back)."""
    gate, up = mlp.gate_proj, mlp.up_proj
    if not all(type(p) in INT8_LINEARS for p in (gate, up)) or gate.out_features != up.out_features:
        return None
    return fuse_dynamic_int8((gate, up))  # None unless their input widths agree too


def fuse_dynamic_int8(projections: tuple[torch.nn.Module, ...]) -> DynamicQuantizedLinear | None:
    """One dynamic int8 Linear computing every projection's output side by side (the same bits as
    calling each; None unless all are dynamic int8 Linears over one input width).

    Each output channel keeps the scale and zero point its own projection's weight had (a per-tensor
    weight becomes per-channel with its scale repeated), so the int8 weights are the same and fbgemm
    dequantises every output with the same factors; the activations are quantised once per call, as
    each separate call would have quantised the same input."""
    if not all(type(p) in INT8_LINEARS and p.weight().dtype == torch.qint8 for p in projections):
        return None
    weights = [p.weight() for p in projections]  # qint8 [N_i, E]
    if len({w.shape[1] for w in weights}) != 1 or any(_per_channel(w) and w.q_per_channel_axis() != 0 for w in weights):
        return None
    scales, zero_points = zip(*(_channel_qparams(w) for w in weights), strict=True)
    weight = torch._make_per_channel_quantized_tensor(
        torch.cat([w.int_repr() for w in weights]), torch.cat(scales), torch.cat(zero_points), 0
    )  # qint8 [Σ N_i, E]
    biases = [p.bias() for p in projections]
    bias = None
    if any(b is not None for b in biases):
        zeros = [torch.zeros(w.shape[0], dtype=torch.float32) for w in weights]  # x + 0.0 == x
        bias = torch.cat([b if b is not None else z for b, z in zip(biases, zeros, strict=True)])
    fused = type(projections[0])(weight.shape[1], weight.shape[0], dtype=torch.qint8)  # Int8Linear stays one
    fused.set_weight_bias(weight, bias)
    return fused


def _per_channel(weight: torch.Tensor) -> bool:
    return weight.qscheme() not in (torch.per_tensor_affine, torch.per_tensor_symmetric)


def _channel_qparams(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per output channel: (scales [N] float64, zero points [N] int64) of a qint8 weight (per-channel: axis 0)."""
    if not _per_channel(weight):
        rows = weight.shape[0]
        return (
            torch.full((rows,), weight.q_scale(), dtype=torch.float64),
            torch.full((rows,), weight.q_zero_point(), dtype=torch.int64),
        )
    return weight.q_per_channel_scales().to(torch.float64), weight.q_per_channel_zero_points().to(torch.int64)

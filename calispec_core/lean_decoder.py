"""The packed forward for Llama-family decoders (Llama, Qwen2): Hugging Face's ops, without its wrappers.

`batch_forward.packed_forward` runs a pass through the model's own modules and, when the model is one
of these, through `LeanDecoder` instead of `model(...)`. Why: on the 2-core AVX2 EPYC of wave 13 the int8
0.5B draft's one-token step (~55-67 ms) spent ~11 % of its time in what surrounds the ops (keyword
plumbing through ~10 decorated modules a layer, the attention-interface lookup, the mask HF prepares
and the pass ignores), and ~8 % more in two of its three q/k/v projection calls: each is a separate
fbgemm call that quantises the same activations again. A drafting round pays the draft's step γ times.
Wave 31 fused the MLP's gate and up projections the same way (`int8_fusion.FusedGateUpMLP`, in place of
HF's MLP, so no second copy of their weights) and rotates q and k in one pass over the fused output: 3 % /
2 % off the draft's step at 1 / 8 rows (docs/performance.md, "Fewer calls a layer").

Exactness: the same torch ops in the same order as HF's decoder layer, on the model's own modules
(embedding, rotary embedding, norms' weights, projections, activation, output layer), with attention
row by row as calispec_core/attention.py runs it, so a pass equals HF's pass bitwise (tested). In int8
the q, k and v projections are one fbgemm call whose per-channel weight scales repeat each
projection's own scale: the same int8 weights, the same activation quantisation, the same outputs
bitwise (tested); so are the gate and up projections, and q and k, adjacent in the fused output, are
rotated by one elementwise pass (the same ops per element). Float layers keep their separate calls. Any
other model, or one whose norms or activation these ops would not reproduce, takes HF's path
(`LeanDecoder.build` returns None).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

from calispec_core.attention import grouped_attention
from calispec_core.int8_fusion import FusedGateUpMLP, fuse_dynamic_int8
from calispec_core.kv_cache import SessionLayer

MODEL_TYPES = ("llama", "qwen2")
LAYER_CLASSES = {  # (decoder layer, attention, MLP) as HF names them; an int8 model's MLPs are FusedGateUpMLP
    ("LlamaDecoderLayer", "LlamaAttention", "LlamaMLP"),
    ("LlamaDecoderLayer", "LlamaAttention", "FusedGateUpMLP"),
    ("Qwen2DecoderLayer", "Qwen2Attention", "Qwen2MLP"),
    ("Qwen2DecoderLayer", "Qwen2Attention", "FusedGateUpMLP"),
}


@dataclass(frozen=True)
class _Layer:
    """One decoder layer. Its modules are looked up on every pass, so a Linear path switched after
    build (`onednn_linear.use_default_linear`, as `bench forward` does) is the one both passes run."""

    module: torch.nn.Module  # HF's decoder layer: norms, self_attn (q/k/v/o_proj), mlp
    fused_qkv: DynamicQuantizedLinear | None  # int8 only: q, k, v in one call (same bits as three)


class LeanDecoder:
    """One packed pass over a Llama-family model's modules (not thread-safe: the compute thread runs it)."""

    def __init__(self, model: torch.nn.Module) -> None:
        config = model.config
        self.model = model
        self.heads = config.num_attention_heads  # H_q
        self.kv_heads = config.num_key_value_heads  # H_kv
        heads = self.heads + 2 * self.kv_heads
        self.layers = [_build_layer(layer, heads) for layer in model.model.layers[: config.num_hidden_layers]]

    @classmethod
    def build(cls, model: torch.nn.Module) -> LeanDecoder | None:
        """A decoder for `model`, or None where its layers are not the ones these ops reproduce."""
        return cls(model) if reproduces(model) else None

    def forward(
        self,
        input_ids: torch.Tensor,  # [1, T] the rows' new tokens end to end
        positions: torch.Tensor,  # [1, T] each token's position in its own row
        caches: list[list[SessionLayer]],  # [layer][row] each row's own cache layer, extended in place
        widths: list[int],  # n_b: new tokens per row, Σ n_b = T
        masks: list[torch.Tensor | None],  # per row [g·n_b, L_b + n_b] bool (attention.causal_masks)
        kept: torch.Tensor,  # [K] positions in T whose logits are returned
    ) -> torch.Tensor:  # [K, V]
        base = self.model.model
        hidden = base.embed_tokens(input_ids)  # [1, T, E]
        cos, sin = base.rotary_emb(hidden, positions)  # [1, T, D] each
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [1, 1, T, D]
        for layer, rows in zip(self.layers, caches, strict=True):
            hidden = self._run_layer(layer, rows, hidden, cos, sin, widths, masks)
        hidden = base.norm(hidden)  # [1, T, E]
        return self.model.lm_head(hidden[:, kept, :])[0]  # [K, V]

    def _run_layer(
        self,
        layer: _Layer,
        rows: list[SessionLayer],
        hidden: torch.Tensor,  # [1, T, E]
        cos: torch.Tensor,  # [1, 1, T, D]
        sin: torch.Tensor,  # [1, 1, T, D]
        widths: list[int],
        masks: list[torch.Tensor | None],
    ) -> torch.Tensor:  # [1, T, E]
        module = layer.module
        attn, mlp = module.self_attn, module.mlp
        tokens = hidden.shape[1]
        query, key, value = self._attention_inputs(layer, module.input_layernorm(hidden), cos, sin)
        outputs = []
        for row, q, k, v, mask in zip(
            rows, query.split(widths, 2), key.split(widths, 2), value.split(widths, 2), masks, strict=True
        ):
            row.append(k, v)
            outputs.append(grouped_attention(q, row.keys, row.values, mask, attn.scaling))  # [1, H_q, n_b, D]
        attended = torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]  # [1, H_q, T, D]
        attended = attended.transpose(1, 2).reshape(1, tokens, -1)  # [1, T, H_q·D]
        hidden = hidden + attn.o_proj(attended)
        normed = module.post_attention_layernorm(hidden)
        if isinstance(mlp, FusedGateUpMLP):  # int8 (modeling.quantize_int8): our module, its ops without a wrapper
            return hidden + mlp.forward(normed)
        return hidden + mlp.down_proj(mlp.act_fn(mlp.gate_proj(normed)) * mlp.up_proj(normed))

    def _attention_inputs(
        self, layer: _Layer, normed: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """normed [1, T, E] -> rotated query [1, H_q, T, D], rotated key and value [1, H_kv, T, D]."""
        attn = layer.module.self_attn
        tokens, dim = normed.shape[1], attn.head_dim
        if layer.fused_qkv is not None:  # q and k adjacent in one output: one rotation for both
            heads = layer.fused_qkv(normed).view(1, tokens, -1, dim).transpose(1, 2)  # [1, H_q + 2·H_kv, T, D]
            rotated = _rotate(heads[:, : self.heads + self.kv_heads], cos, sin)  # [1, H_q + H_kv, T, D]
            query, key = rotated.split((self.heads, self.kv_heads), dim=1)
            return query, key, heads[:, self.heads + self.kv_heads :]
        query, key, value = attn.q_proj(normed), attn.k_proj(normed), attn.v_proj(normed)
        query = _rotate(query.view(1, tokens, self.heads, dim).transpose(1, 2), cos, sin)  # [1, H_q, T, D]
        key = _rotate(key.view(1, tokens, self.kv_heads, dim).transpose(1, 2), cos, sin)  # [1, H_kv, T, D]
        return query, key, value.view(1, tokens, self.kv_heads, dim).transpose(1, 2)  # value [1, H_kv, T, D]


def reproduces(model: torch.nn.Module) -> bool:
    """Whether `model` is built of the Llama/Qwen2 classes whose forward `LeanDecoder` repeats op for op (the
    norms, activation and rotary embedding are the model's own modules, called as HF calls them)."""
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if getattr(model.config, "model_type", None) not in MODEL_TYPES or layers is None:
        return False
    if not all(hasattr(base, name) for name in ("embed_tokens", "rotary_emb", "norm")) or not hasattr(model, "lm_head"):
        return False
    return all(
        (type(layer).__name__, type(layer.self_attn).__name__, type(layer.mlp).__name__) in LAYER_CLASSES
        for layer in layers
    )


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's apply_rotary_pos_emb for one of q, k: x·cos + rotate_half(x)·sin."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


def _build_layer(layer: torch.nn.Module, heads: int) -> _Layer:
    """`heads`: H_q + 2·H_kv, the heads of head_dim `_attention_inputs` reads the fused q/k/v output as."""
    attn = layer.self_attn
    fused = fuse_dynamic_int8((attn.q_proj, attn.k_proj, attn.v_proj))
    assert fused is None or fused.out_features == heads * attn.head_dim, "q/k/v widths are not heads × head_dim"
    return _Layer(layer, fused)

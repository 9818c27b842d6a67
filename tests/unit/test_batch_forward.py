"""A batched multi-session forward equals one forward per session (float32)."""

from __future__ import annotations

import pytest
import torch

from calispec_core.attention import ATTENTION
from calispec_core.batch_forward import forward_rows
from calispec_core.compute import compute_thread
from calispec_core.errors import InvalidArgument
from calispec_core.kv_cache import SessionLayer
from calispec_core.modeling import ModelRunner, ModelSpec, prefill_session
from tests.conftest import TinyPair

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [20], [30, 31, 32]]  # different lengths, one with an empty cache
DRAFTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
TOLERANCE = 1e-4  # float32 matmuls of different shapes round differently; argmax must not change


def test_rows_match_unbatched_forwards_and_caches_continue(target_runner: ModelRunner) -> None:
    alone = []
    for i, (prompt, draft) in enumerate(zip(PROMPTS, DRAFTS, strict=True)):
        s = prefill_session(target_runner, f"alone{i}", prompt)
        alone.append(target_runner.forward(s.pending() + draft, s.cache, len(draft) + 1)[0])
    sessions = [prefill_session(target_runner, f"batch{i}", p) for i, p in enumerate(PROMPTS)]
    inputs = [s.pending() + d for s, d in zip(sessions, DRAFTS, strict=True)]
    caches = [s.cache for s in sessions]
    rows = forward_rows(target_runner, caches, inputs, [len(d) + 1 for d in DRAFTS])
    for expected, got in zip(alone, rows, strict=True):
        assert got.shape == expected.shape
        assert torch.allclose(got, expected, atol=TOLERANCE)
        assert torch.equal(got.argmax(-1), expected.argmax(-1))
    assert [c.get_seq_length() for c in caches] == [
        len(p) - 1 + len(d) + 1 for p, d in zip(PROMPTS, DRAFTS, strict=True)
    ]

    # each returned cache is that session's own: a further batched step equals a fresh prefill
    rows2 = forward_rows(target_runner, caches, [[3]] * 3, [1, 1, 1])
    for i, (prompt, draft) in enumerate(zip(PROMPTS, DRAFTS, strict=True)):
        fresh = prefill_session(target_runner, f"fresh{i}", [*prompt, *draft, 3])
        expected = target_runner.forward(fresh.pending(), fresh.cache, 1)[0]
        assert torch.allclose(rows2[i], expected, atol=TOLERANCE)


def test_single_row_extends_the_sessions_own_cache(target_runner: ModelRunner) -> None:
    session = prefill_session(target_runner, "one", PROMPTS[0])
    rows = forward_rows(target_runner, [session.cache], [[*session.pending(), 1]], [2])
    assert rows[0].shape == (2, target_runner.vocab_size) and session.cached_len == len(PROMPTS[0]) + 1


def test_a_batched_pass_writes_into_each_sessions_buffer_and_copies_no_cache(target_runner: ModelRunner) -> None:
    """Issue #11: no whole-KV copies per round. Each row's new entries land in its own preallocated buffer
    (same storage before and after), and the entries it had are untouched."""
    sessions = [prefill_session(target_runner, f"buf{i}", p) for i, p in enumerate(PROMPTS)]
    cached = [(s, d) for s, d in zip(sessions, DRAFTS, strict=True) if s.cached_len]  # a 1-token prompt has none
    before = [
        [(layer.keys.clone(), layer.values.clone(), layer.keys.data_ptr()) for layer in s.cache.layers]
        for s, _ in cached
    ]
    inputs = [s.pending() + d for s, d in zip(sessions, DRAFTS, strict=True)]
    forward_rows(target_runner, [s.cache for s in sessions], inputs, [1, 1, 1])
    for (session, draft), layers in zip(cached, before, strict=True):
        for layer, (keys, values, pointer) in zip(session.cache.layers, layers, strict=True):
            length = keys.shape[-2]
            assert layer.keys.shape[-2] == length + 1 + len(draft)  # extended in place by pending + draft
            assert layer.keys.data_ptr() == pointer  # the same buffer: nothing was reallocated or concatenated
            assert torch.equal(layer.keys[:, :, :length], keys) and torch.equal(layer.values[:, :, :length], values)


def test_models_load_with_the_per_row_attention(target_runner: ModelRunner) -> None:
    assert target_runner.model.config._attn_implementation == ATTENTION
    assert all(isinstance(layer, SessionLayer) for layer in target_runner.new_cache().layers)


def test_keeping_the_last_logits_never_copies_the_output_layer(tiny_pair: TinyPair) -> None:
    """HF's `logits_to_keep=1` slices the last hidden state as a strided [1, 1, H] view, which torch's
    matmul runs as a bmm against the [V, H] output weight expanded and, in bf16, copied whole: 467 MB and
    ~1.2 s per prefill chunk for the 1.5B target. The rounds' pass selects kept positions by index."""
    runner = ModelRunner(ModelSpec(tiny_pair.target, dtype="bfloat16", device="cpu"))
    weight = runner.model.get_output_embeddings().weight  # [V, H]
    session = prefill_session(runner, "chunk", list(range(3, 40)))

    def profiled() -> torch.profiler.profile:
        with torch.profiler.profile(record_shapes=True) as prof:  # on the thread that computes
            runner.forward([7, 8, 9, 10, 11, 12], session.cache, logits_to_keep=1)
        return prof

    def profiled_batch() -> torch.profiler.profile:  # calibration's padded generation: [B, S], keep 1
        ids = torch.arange(3, 27).view(2, 12)
        with torch.profiler.profile(record_shapes=True) as prof:
            runner.forward_batch(ids, torch.ones_like(ids), torch.arange(12).expand(2, 12), runner.new_cache(), 1)
        return prof

    for prof in (compute_thread().run(profiled), compute_thread().run(profiled_batch)):
        linear_ops = ("aten::linear", "mkldnn::_linear_pointwise")  # torch's path, or oneDNN's (packed bf16)
        assert any(event.name in linear_ops for event in prof.events())  # it saw the forward
        copied = [
            shape
            for event in prof.events()
            if event.name in ("aten::copy_", "aten::clone")
            for shape in event.input_shapes
            if shape and torch.Size(shape).numel() >= weight.numel()
        ]
        assert copied == []


def test_session_caches_refuse_what_they_cannot_keep(target_runner: ModelRunner) -> None:
    """HF's beam-search and offloading hooks replace a layer's tensors; the next in-place write would drop that."""
    layer = prefill_session(target_runner, "beam", PROMPTS[0]).cache.layers[0]
    for call in (
        lambda: layer.reorder_cache(torch.tensor([0])),
        lambda: layer.batch_select_indices(torch.tensor([0])),
        lambda: layer.batch_repeat_interleave(2),
        layer.offload,
        layer.prefetch,
    ):
        with pytest.raises(NotImplementedError):
            call()
    with pytest.raises(InvalidArgument, match="logits_to_keep"):
        target_runner.forward([1, 2], prefill_session(target_runner, "zero", PROMPTS[0]).cache, 0)

"""Dynamic int8 Linear layers that quantise a sequence's first token apart from the other rows (no gRPC here).

A dynamic int8 Linear (fbgemm) quantises its whole input with one scale, from the input's min and max. LLMs
put *massive activations* on a sequence's first token (Sun et al., 2024, "Massive activations in large
language models"): in the 0.5B Qwen draft, the first token's inputs to some layers reach 34-172 where the
other tokens of a 256-token text stay under ~19 (layer 3's MLP: 172 against at most 11.5). One scale over both
quantises every other row 4-15× more coarsely in those layers. Serving meets this in every forward that
holds a prompt's first token (its prefill, or a riding prompt together with other sessions' decode rows);
teacher-forced calibration meets it in every forward (each packed document starts at position 0).

`isolating_outliers()` marks such a forward. Inside it, an `Int8Linear` quantises the rows whose largest
|activation| exceeds `OUTLIER_RATIO` × the median row's in a call of their own, and the rest in another: the
same int8 weights, each group on a scale of its own. Outside it (decode steps: no row at position 0), the
layer is torch's dynamic Linear, unchanged, with no extra work. Measured on the shipped pair
(docs/performance.md, "A prompt's first token, quantised apart"): the draft's greedy agreement with the
target's greedy continuation of 12 shipped prompts, decoding after its own int8 prefill, rose from 85.4 % to
87.5 %; teacher-forced calibration reproduces far more of an SD run's events and far fewer others.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

from calispec_core import int8_gemm
from calispec_core.argmax import argmax_last

OUTLIER_RATIO = 4.0  # a row is an outlier where its largest |activation| exceeds this × the median row's

_isolating: contextvars.ContextVar[bool] = contextvars.ContextVar("int8_isolating_outliers", default=False)


@contextmanager
def isolating_outliers(active: bool = True) -> Iterator[None]:
    """Within this block (this context: a thread's, or an asyncio task's), `Int8Linear` layers quantise outlier
    rows apart."""
    token = _isolating.set(active)
    try:
        yield
    finally:
        _isolating.reset(token)


class Int8Linear(DynamicQuantizedLinear):
    """torch's dynamic int8 Linear, whose outlier rows get a quantisation call of their own inside
    `isolating_outliers()`, and whose calls over many rows take oneDNN's integer GEMM, same bits, inside
    `int8_gemm.many_rows()`. It adds no state: `use_int8_outlier_split` turns a quantised model's layers into it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., E] -> [..., N]
        if not (_isolating.get() or int8_gemm.in_many_rows()):
            return super().forward(x)  # a decode step: torch's layer with nothing in between (~170 calls a step)
        rows = x.reshape(-1, x.shape[-1])  # [R, E]
        return self._by_rows(rows, self._linear).view(*x.shape[:-1], self.out_features)

    def greedy(self, rows: torch.Tensor) -> torch.Tensor:  # [R, E] -> [R] int64
        """argmax(self(rows), -1), without the [R, N] logits where `int8_gemm.greedy_head` is exact."""
        return self._by_rows(rows, self._argmax)

    def _linear(self, rows: torch.Tensor) -> torch.Tensor:  # [R, E] -> [R, N]
        if int8_gemm.applies(self, rows):
            return int8_gemm.int8_linear(self, rows)
        return super().forward(rows)

    def _argmax(self, rows: torch.Tensor) -> torch.Tensor:  # [R, E] -> [R]
        if int8_gemm.head_applies(self, rows):
            return int8_gemm.greedy_head(self, rows)
        return argmax_last(self._linear(rows))

    def _by_rows(self, rows: torch.Tensor, call: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """call(rows) (row by row results: [R, ...]), the outlier rows quantised apart inside `isolating_outliers()`
        (unless every row gets a scale of its own here anyway: `int8_gemm.many_rows(row_scales=True)`)."""
        if not _isolating.get() or rows.shape[0] < 2 or (int8_gemm.row_scales() and int8_gemm.applies(self, rows)):
            return call(rows)
        # max(|row|) from two reductions: no [R, E] temporary (abs() wrote one per call: 10 MB at 512 rows of 4,864)
        peaks = torch.maximum(rows.amax(dim=-1), rows.amin(dim=-1).neg())  # [R]
        outliers = peaks > OUTLIER_RATIO * peaks.median()  # [R] bool
        if not bool(outliers.any()):  # CPU only (dynamic int8): no device sync
            return call(rows)
        apart = outliers.nonzero().squeeze(1)  # [A]
        kept = rows[apart]  # [A, E] a copy
        # The other rows in one call with the outlier rows zeroed: a quantisation range always holds 0, so their
        # scale and outputs are the same bits as a call over them alone, and only the few outlier rows move. Zeroed
        # in place and restored after (a masked copy of the whole input cost more than the outlier call itself);
        # other layers read the same input (q/k/v, gate/up), so it must leave as it came.
        rows[apart] = 0.0
        try:
            out = call(rows)  # [R, ...], outlier rows wrong until replaced
        finally:
            rows[apart] = kept
        out[apart] = call(kept)
        return out


def use_int8_outlier_split(model: torch.nn.Module) -> int:
    """Turn every dynamic int8 Linear of `model` into an `Int8Linear` (same weights, same module); returns how many."""
    layers = [m for m in model.modules() if type(m) is DynamicQuantizedLinear]
    for layer in layers:
        layer.__class__ = Int8Linear  # a subclass without state of its own: the packed weights stay as they are
    return len(layers)

"""fbgemm's dynamic int8 Linear, recomputed bit for bit on oneDNN's integer GEMM for many rows (no gRPC here).

torch's dynamic int8 Linear (fbgemm) does three things, and each can be redone exactly:
1. one activation scale and zero point from the input's min and max (`torch._choose_qparams_per_tensor`: the same
   function, with the 7-bit range x86 asks for), and fbgemm's own quantisation (`torch.quantize_per_tensor`);
2. an exact integer GEMM, u8 × s8 → s32, less zero_point × each weight column's sum;
3. back to float: float(acc) × (scale × w_scale), one multiplier per tensor or per output channel.
Integer arithmetic is exact on any engine, so oneDNN gives the same accumulators. Two ways in (`gemm_path`):
- "matmul": oneDNN's matmul primitive through torch's x86 quantised Linear op (`torch.ops.onednn.qlinear_pointwise`)
  with unit scales, zero point in, float32 out: float(acc), but as float(Σ q·w) − float(zero_point · Σ w), so only
  where both stay under 2^24 (`_float_exact`: inputs narrower than 1,024 at x86's 7-bit range); wider layers (the
  draft's MLP down projection) take "int_mm". It runs AMX's brgemm where the CPU has AMX; on the AMX VM of wave 46,
  over 512 rows, 2.0× `torch._int_mm`'s speed for the draft's MLP gate and up layers and 1.8× for its output layer
  (docs/measurements/wave46-amx/int8-gemm-paths.txt, where its down layer, K = 4,864, ran 0.6×).
- "int_mm": `torch._int_mm` (s8 × s8, so u8 − 128, corrected by 128 − zero_point times the column sums), which
  reaches oneDNN's gemm API (VNNI, no AMX): wave 43's path, 1.3-1.5× faster than fbgemm over 512 rows, the fallback.
Neither is faster than fbgemm over a few rows. `torch.quantize_per_tensor` rounds a half-way activation as
the layer does (tested). Layers with a bias stay on fbgemm: its fused fma(acc, multiplier, bias) matched torch's
`add(alpha=)` and `addcmul` on most elements but not on all (why was not traced), and they are the narrow q/k/v
projections; so do weights with a zero point (none here: torch's int8 weights are symmetric). `gemm_path()` checks
each path against torch's own layer once per process (for each mode, one scale a call or row scales) and takes the
first exact one.

Inside `many_rows(row_scales=True)` step 1 is done per row instead (`_row_qparams`: the same function's arithmetic for
every row at once, float64 where it computes in double; `_quantize_rows`: fbgemm's quantisation with each row's
scale, tested against it): each row's outputs are then the bits of torch's layer called on that row alone, what
serving computes in a one-token decode step, whatever other rows share the call. The matmul path then takes zero
point 0 and subtracts each row's zero point × Σ w itself (every term an integer under 2^24: exact).

`greedy_head` goes one step further for an output layer: the argmax of its logits straight from the integer
accumulators (they are scaled by one positive factor), never writing the [rows, vocabulary] float logits.
"""

from __future__ import annotations

import contextvars
import functools
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

MIN_ROWS = 128  # fewer rows: fbgemm is as fast (one-token decode steps never come here)
_SHIFT = 128  # q − 128 fits int8 whatever q's 8-bit value: torch._int_mm takes s8 × s8
GEMM_PATHS = ("matmul", "int_mm")  # in order of preference (module docstring)
_SMALL_SCALE = torch.tensor(6.1e-5, dtype=torch.float32)  # quant_utils' SMALL_SCALE_THRESHOLD (a float)
# Row scales' quantisation: two float32 steps land within three roundings of 2^-17 (values under 256) of the fused
# result, so only values this near half-way between two levels can round the other way; checked in blocks of this many
_NEAR = 2.0**-14
_NEAR_BLOCK = 64  # (a whole row where the width is not a multiple)


@dataclass(frozen=True)
class _Weights:
    """What the recipe needs of one layer, read once: torch unpacks its weights (~11 ms for a draft MLP) at every
    `layer.weight()` or `layer.bias()`."""

    packed: object  # the layer's packed weights these were read from (new weights: read again)
    path: str  # the GEMM path `gemm` is laid out for
    gemm: torch.Tensor | None  # matmul: oneDNN's blocked int8 copy; int_mm: int8 [K, N]; None: stays on fbgemm
    col_sums: torch.Tensor | None  # int32 [N] Σ_k w_kj: int_mm's correction for the shift, row zero points' on matmul
    scale: torch.Tensor | None  # float32 [] or [N] (per output channel)


_weights: weakref.WeakKeyDictionary[torch.nn.Module, _Weights] = weakref.WeakKeyDictionary()  # gone with the layer


_many_rows: contextvars.ContextVar[bool] = contextvars.ContextVar("int8_gemm_many_rows", default=False)
_row_scales: contextvars.ContextVar[bool] = contextvars.ContextVar("int8_gemm_row_scales", default=False)


@contextmanager
def many_rows(row_scales: bool = False) -> Iterator[None]:
    """Within this block (this context), `Int8Linear` layers take this module's path where it `applies`; with
    `row_scales`, on every row's own activation scale (the module docstring). Only teacher-forced calibration asks:
    the int8 weights it caches (oneDNN's blocked copy, or transposed) are a second copy of the model's (~0.5 GB for
    the 0.5B draft), which a serving process should not carry for its few long prefills."""
    tokens = _many_rows.set(True), _row_scales.set(row_scales)
    try:
        yield
    finally:
        _row_scales.reset(tokens[1])
        _many_rows.reset(tokens[0])


def in_many_rows() -> bool:
    """Inside `many_rows()`."""
    return _many_rows.get()


def row_scales() -> bool:
    """Inside `many_rows(row_scales=True)`."""
    return _many_rows.get() and _row_scales.get()


def prepare(model: torch.nn.Module, row_scales: bool = False) -> int:
    """Read every dynamic int8 Linear's weights for the recipe now (a model load's work: ~1.5 s for the 0.5B
    draft), not inside the first forward that takes this path; returns how many layers can. Nothing when the
    recipe is not exact here."""
    path = gemm_path(row_scales) if torch.backends.quantized.engine == "fbgemm" else None
    if path is None:
        return 0
    layers = [m for m in model.modules() if isinstance(m, DynamicQuantizedLinear)]
    return sum(_layer_weights(m, path).gemm is not None for m in layers)


def applies(layer: torch.nn.Module, rows: torch.Tensor) -> bool:
    """Whether `int8_linear` may replace this call: inside `many_rows()`, enough rows (any number with row scales,
    which torch's layer has no form of), no bias, fbgemm's engine on CPU, exact here."""
    return (
        in_many_rows()
        and (rows.shape[0] >= MIN_ROWS or row_scales())
        and rows.device.type == "cpu"
        and isinstance(layer, DynamicQuantizedLinear)
        and layer._packed_params.dtype == torch.qint8
        and torch.backends.quantized.engine == "fbgemm"
        and (path := gemm_path(row_scales())) is not None
        and _layer_weights(layer, path).gemm is not None
    )


def int8_linear(
    layer: DynamicQuantizedLinear, rows: torch.Tensor, path: str | None = None
) -> torch.Tensor:  # [R, K] -> [R, N]
    """layer(rows) as fbgemm computes it, bit for bit, for a layer without a bias (see the module docstring), on
    `path` (None: `gemm_path` for this context's mode); with row scales, each row as the layer on it alone."""
    acc, multiplier = _accumulators(layer, rows, _resolved(path))  # [R, N] int32 or float32
    return acc.float().mul_(multiplier)


def greedy_head(
    layer: DynamicQuantizedLinear, rows: torch.Tensor, path: str | None = None
) -> torch.Tensor:  # [R, K] -> [R] int64
    """argmax(layer(rows), -1) without the float logits: exact for a per-tensor weight scale and no bias, where
    every logit is float(acc) × one positive multiplier (float(acc) exact: |acc| < 2^24). Ties as torch's argmax:
    the first index whose float logit equals the row's largest."""
    acc, multiplier = _accumulators(layer, rows, _resolved(path))  # [R, N] int32 or float32
    return scaled_argmax(acc, multiplier.view(-1))  # one multiplier, or one a row


def _resolved(path: str | None) -> str:
    path = path or gemm_path(row_scales())
    if path is None:
        raise RuntimeError("no exact integer GEMM path here: callers ask `applies` first")
    return path


def scaled_argmax(acc: torch.Tensor, multiplier: float | torch.Tensor) -> torch.Tensor:  # [R, N] -> [R] int64
    """argmax(acc.float() * multiplier, -1) for a float32 multiplier > 0 (one, or [R]: one a row) and integer
    accumulators |acc| < 2^24 (as int32, or as float32, exact below 2^24), from the integers: the product is
    monotonic, but it can round neighbours onto one float (where the multiplier is under a float32 step of the
    logits; over half a step while |acc| < 2^24, so at most 3 of them), so the answer is the first index whose
    accumulator reaches the smallest one that rounds onto the top logit."""
    top = acc.amax(dim=-1)  # [R]
    top_logit = top.float() * multiplier  # [R]
    threshold = top.clone()  # [R]
    for step in range(1, 4):
        lower = top - step  # [R]
        joins = (lower.float() * multiplier == top_logit) & (threshold == lower + 1)  # [R] the run goes on
        threshold = torch.where(joins, lower, threshold)
    at_top = acc.numpy() >= threshold.numpy()[:, None]  # [R, N] bool
    return torch.from_numpy(np.argmax(at_top, axis=1).astype(np.int64))


def head_applies(layer: torch.nn.Module, rows: torch.Tensor) -> bool:
    """`greedy_head` is exact for this output layer: `applies`, one weight scale, accumulators < 2^24."""
    path = gemm_path(row_scales())
    return applies(layer, rows) and path is not None and _greedy_exact(layer, path)


def _greedy_exact(layer: DynamicQuantizedLinear, path: str) -> bool:
    """One weight scale and accumulators under 2^24: the logits' order is the accumulators' (`greedy_head`)."""
    return _layer_weights(layer, path).scale.dim() == 0 and _float_exact(layer)


def _accumulators(layer: DynamicQuantizedLinear, rows: torch.Tensor, path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ_k (q_ik − zero_point) · w_kj [R, N] as int32 (int_mm) or its float32 (matmul), the float32 multiplier back
    to the layer's output: activation scale × weight scale, [] or [N]; with row scales [R, 1] or [R, N])."""
    weights = _layer_weights(layer, path)
    if row_scales():
        scale, row_zero_points = _row_qparams(rows, _levels(layer))  # [R] float32, [R] int32
        quantized = _quantize_rows(rows, scale, row_zero_points)  # [R, K] u8
        zero_point: int | torch.Tensor = row_zero_points
        scale = scale.unsqueeze(1)  # [R, 1]
    else:
        scale64, zero_point = torch._choose_qparams_per_tensor(rows, _levels(layer) == 128)
        scale = torch.tensor(scale64, dtype=torch.float32)  # fbgemm quantises with the float32 scale
        quantized = torch.quantize_per_tensor(rows, float(scale), zero_point, torch.quint8).int_repr()  # [R, K] u8
    return _gemm(weights.path, layer, weights, quantized, zero_point), scale * weights.scale


def _row_qparams(rows: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:  # [R, K] -> [R], [R]
    """(float32 scale, int32 zero point) of `torch._choose_qparams_per_tensor(row, levels == 128)` for every row:
    quant_utils::ChooseQuantizationParams step by step, in float32 where it holds a float and float64 where a
    double (its scale, its zero-point arithmetic)."""
    qmax = levels - 1  # 127 at x86's 7-bit range (255 // 2), else 255; qmin is 0
    lo, hi = torch.aminmax(rows, dim=-1)  # [R] float32 each, one pass
    lo, hi = lo.clamp_(max=0.0), hi.clamp_(min=0.0)  # the range always holds 0
    scale = (hi.double() - lo.double()) / qmax  # [R] float64
    unusable = (scale.float() == 0) | torch.isinf(1.0 / scale.float())  # [R] its reciprocal would be infinite
    scale = torch.where(unusable, 0.1, scale)
    small = scale < _SMALL_SCALE.double()  # [R] raised to the threshold, the range widened to match
    if bool(small.any()):
        amplifier = _SMALL_SCALE / scale.float()  # [R] float32, as the C++ `float amplifier`
        span = _SMALL_SCALE * qmax
        widened_hi = torch.where(lo == 0, span, torch.where(hi == 0, hi, hi * amplifier))
        widened_lo = torch.where(lo == 0, lo, torch.where(hi == 0, -span, lo * amplifier))
        lo, hi = torch.where(small, widened_lo, lo), torch.where(small, widened_hi, hi)
        scale = torch.where(small, _SMALL_SCALE.double(), scale)
    lo_steps, hi_steps = lo.double() / scale, hi.double() / scale  # [R] the range in steps of the scale
    # the zero point that maps lo to 0 or the one that maps hi to qmax, whichever has the smaller error
    initial = torch.where(-lo_steps.abs() < qmax - hi_steps.abs(), -lo_steps, qmax - hi_steps)
    zero_point = initial.clamp(0, qmax).round()  # [R] nearbyint: half to even, as torch.round
    return scale.float(), zero_point.to(torch.int32)


def _quantize_rows(rows: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:  # -> [R, K] u8
    """Each row of [R, K] float32 quantised as fbgemm quantises it (`torch.quantize_per_tensor` on that row alone):
    round(fma(x, 1 / scale, zero_point)), one rounding to float32 then to the nearest level, half to even, clipped.
    torch has no fused multiply-add, so x × (1 / scale) + zero_point is taken in two float32 steps first (within two
    float32 steps of the fused result), and only the blocks of `_NEAR_BLOCK` values holding one within `_NEAR` of
    half-way between two levels, where that can round the other way, are redone exactly (`_fma_rounded`)."""
    inverse = (1.0 / scale).unsqueeze(1)  # [R, 1] float32, fbgemm's 1.f / scale
    zp = zero_point.unsqueeze(1).float()  # [R, 1]
    levels = (rows * inverse).add_(zp)  # [R, K]
    rounded = levels.round()  # [R, K]
    r, k = rows.shape
    block = _NEAR_BLOCK if k % _NEAR_BLOCK == 0 else k
    off = levels.sub_(rounded).abs_().view(r, k // block, block).amax(dim=-1)  # [R, K / block] farthest from a level
    near = (off > 0.5 - _NEAR).nonzero()  # [S, 2] (row, block) holding a value near half-way
    if near.numel():
        row, first = near[:, 0], near[:, 1:] * block  # [S], [S, 1]
        cols = first + torch.arange(block)  # [S, block]
        rows_of = row.unsqueeze(1).expand_as(cols)  # [S, block]
        rounded[rows_of, cols] = _fma_rounded(rows[rows_of, cols], inverse[row], zp[row])
    return rounded.clamp_(0, 255).to(torch.uint8)


def _fma_rounded(x: torch.Tensor, inverse: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:  # [S, B] each
    """round(float32(x × inverse + zero_point)) with the sum rounded once, as a fused multiply-add does: the product
    is exact in float64 (24 × 24 bits), the sum's rounding error exact by TwoSum, and where the float64 sum sits
    exactly half-way between two float32s, that error says which side the exact value is on."""
    product = x.double() * inverse.double()  # [S, B] exact
    total = product + zero_point.double()
    back = total - product
    error = (product - (total - back)) + (zero_point.double() - back)  # total + error == product + zero_point
    nearest = total.float()
    up = torch.nextafter(nearest, torch.tensor(float("inf")))
    down = torch.nextafter(nearest, torch.tensor(float("-inf")))
    nearest = torch.where((total == (nearest.double() + up.double()) / 2) & (error > 0), up, nearest)
    nearest = torch.where((total == (nearest.double() + down.double()) / 2) & (error < 0), down, nearest)
    return nearest.round()


def _gemm(
    path: str, layer: DynamicQuantizedLinear, weights: _Weights, quantized: torch.Tensor, zero_point: int | torch.Tensor
) -> torch.Tensor:
    """Σ_k (q_ik − zero_point) · w_kj: [R, K] u8 -> [R, N] int32 (int_mm) or float32 (matmul: float(acc), the
    primitive's scales all 1). `zero_point`: one, or int32 [R] (one a row)."""
    assert weights.col_sums is not None
    if path == "matmul":
        out = torch.ops.onednn.qlinear_pointwise(
            quantized, 1.0, zero_point if isinstance(zero_point, int) else 0, weights.gemm,
            *_unit_scales(layer.out_features), None, 1.0, 0, torch.float32, "none", [], "",
        )  # fmt: skip
        if isinstance(zero_point, int):
            return out
        # float(Σ q·w) − zero_point_i · Σ_k w_kj: every term an integer under 2^24 (`_float_exact`), so exact
        return out.addr_(zero_point.float(), weights.col_sums.float(), alpha=-1)
    shifted = quantized.view(torch.int8).bitwise_xor_(-_SHIFT)  # [R, K] u8 − 128 as s8 (flips the top bit)
    acc = torch._int_mm(shifted, weights.gemm)  # [R, N] Σ (q − 128) · w
    if isinstance(zero_point, int):
        return acc.add_(weights.col_sums * (_SHIFT - zero_point))  # + (128 − zero_point) · Σ_k w_kj
    return acc.addr_(_SHIFT - zero_point, weights.col_sums)  # + (128 − zero_point_i) · Σ_k w_kj, row by row


def _levels(layer: DynamicQuantizedLinear) -> int:
    """Activation levels: 128 (x86's 7-bit range, what torch's layer asks fbgemm for since its version 4), else 256."""
    return 128 if layer.version is not None and layer.version >= 4 else 256


def _layer_weights(layer: DynamicQuantizedLinear, path: str) -> _Weights:
    """The layer's weights laid out for `path` where that is exact for the layer, else for "int_mm", read again for
    new weights."""
    packed = layer._packed_params._packed_params
    cached = _weights.get(layer)
    wanted = _layer_path(layer, path)
    if cached is None or cached.packed is not packed or cached.path != wanted:
        cached = _read_weights(layer, packed, wanted)
        _weights[layer] = cached
    return cached


def _layer_path(layer: DynamicQuantizedLinear, path: str) -> str:
    return path if path != "matmul" or _float_exact(layer) else "int_mm"


def _float_exact(layer: DynamicQuantizedLinear) -> bool:
    """Every sum of the layer's products is under 2^24 (q, zero_point < levels, |w| <= 128), so a float holds it
    exactly: the matmul primitive's float(Σ q·w) and float(zero_point · Σ w) (their difference then rounds once, as
    float(acc) does), and an output layer's accumulators for `greedy_head`."""
    return layer.in_features * _levels(layer) * 128 < 2**24


def _read_weights(layer: DynamicQuantizedLinear, packed: object, path: str) -> _Weights:
    weight, bias = layer._weight_bias()  # qint8 [N, K], float [N] or None
    per_tensor = weight.qscheme() == torch.per_tensor_affine
    symmetric = weight.q_zero_point() == 0 if per_tensor else not weight.q_per_channel_zero_points().any()
    if bias is not None or not symmetric:  # fbgemm's fused bias add; or it subtracts w's zero point times row sums
        return _Weights(packed, path, None, None, None)
    ints = weight.int_repr()  # [N, K]
    scale = torch.tensor(weight.q_scale()) if per_tensor else weight.q_per_channel_scales()
    col_sums = ints.sum(dim=1, dtype=torch.int32)  # [N]
    if path == "matmul":
        return _Weights(packed, path, torch.ops.onednn.qlinear_prepack(ints, None), col_sums, scale.float())
    return _Weights(packed, path, ints.t(), col_sums, scale.float())


@functools.cache
def _unit_scales(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The matmul primitive's [n] weight scales, 1, and zero points, 0: it then returns float(acc) itself."""
    return torch.ones(n), torch.zeros(n, dtype=torch.int32)


def gemm_path(row_scales: bool = False) -> str | None:
    """The first of `GEMM_PATHS` whose recipe gives torch's own layer's bits on this machine and build (with
    `row_scales`: its bits on each row alone), checked once a process for each mode; None: neither (no oneDNN int8
    here). Callers ask only with fbgemm as the engine."""
    return _gemm_path(bool(row_scales))


@functools.cache
def _gemm_path(row_scales: bool) -> str | None:
    return next((path for path in GEMM_PATHS if exact_with(path, row_scales)), None)


def exact_here(row_scales: bool = False) -> bool:
    """Some path of the recipe is exact here."""
    return gemm_path(row_scales) is not None


def exact_with(path: str, row_scales: bool = False) -> bool:
    """The recipe on `path` gives torch's layer's bits (with `row_scales`, its bits on each row alone): odd widths,
    per tensor and per channel, an outlier row, a half-way activation, the head's argmax, and a zero point with sums
    near and past 2^24 (where float(acc) rounds and the matmul primitive's two floats would not: such layers take
    int_mm, `_float_exact`)."""
    generator = torch.Generator().manual_seed(0)
    try:
        with many_rows(row_scales):
            return all(_exact_on(layer, rows, path, row_scales) for layer, rows in _check_cases(generator))
    except (RuntimeError, AttributeError, NotImplementedError):  # no such op for CPU in this build
        return False


def _check_cases(generator: torch.Generator) -> Iterator[tuple[DynamicQuantizedLinear, torch.Tensor]]:
    """(layer, rows) for `exact_with`, in order."""
    for k, n, per_channel in ((67, 33, False), (200, 131, False), (75, 41, True)):
        layer = _random_layer(k, n, per_channel, generator)
        rows = torch.randn(MIN_ROWS + 3, k, generator=generator) * 3  # [R, K]
        rows[0] *= 40
        halfway = torch.zeros_like(rows)  # [R, K] scale 0.125, zero point 9: 0.0625 quantises from 9.5, a tie
        halfway[0, :3] = torch.tensor([-1.125, 14.75, 0.0625])
        yield layer, halfway
        yield layer, rows
        yield layer, _near_tie(k)
    for k in (1023, 4100):  # the matmul path's widest, then int_mm's
        yield _past_float_precision(generator, k)


def _exact_on(layer: DynamicQuantizedLinear, rows: torch.Tensor, path: str, row_scales: bool) -> bool:
    """The recipe's outputs, and a per-tensor layer's argmax, are torch's."""
    expected = _torchs(layer, rows, row_scales)  # [R, N] torch's (fbgemm's)
    if not torch.equal(int8_linear(layer, rows, path), expected):
        return False
    return not _greedy_exact(layer, path) or torch.equal(greedy_head(layer, rows, path), expected.argmax(-1))


def _near_tie(k: int) -> torch.Tensor:  # [MIN_ROWS, k]
    """Rows whose range gives scale 0.0222162 and zero point 102, holding 0.2110542: × (1 / scale) is 9.4999962, and
    + 102 in a second float32 step is the tie 111.5 (→ level 112), while the fused multiply-add fbgemm quantises with
    rounds once, to 111.4999924 (→ 111)."""
    rows = torch.zeros(MIN_ROWS, k)
    rows[:, :3] = torch.tensor([-2.272507429122925, 0.5489555597305298, 0.2110542207956314])
    return rows


def _torchs(layer: DynamicQuantizedLinear, rows: torch.Tensor, row_scales: bool) -> torch.Tensor:  # [R, K] -> [R, N]
    """torch's own layer over the rows: in one call, or (row scales) on each row alone."""
    return torch.cat([layer(row[None]) for row in rows]) if row_scales else layer(rows)


def _past_float_precision(generator: torch.Generator, k: int = 4100) -> tuple[DynamicQuantizedLinear, torch.Tensor]:
    """A layer of ±127 weights and rows of 10 on their positive ones, −1 elsewhere (zero point 12): Σ q·w ~ k/2 ·
    127², past 2^24 for k = 4,100; k = 1,023 is the widest input the matmul path takes (`_float_exact`)."""
    n = 37
    signs = torch.randint(0, 2, (n, k), generator=generator).float() * 2 - 1  # [N, K] ±1
    layer = DynamicQuantizedLinear(k, n, bias_=False, dtype=torch.qint8)
    layer.set_weight_bias(torch.quantize_per_tensor(signs, 1 / 127, 0, torch.qint8), None)
    rows = torch.where(signs[torch.arange(MIN_ROWS) % n] > 0, 10.0, -1.0)  # [R, K] row i saturates column i % n
    return layer, rows


def _random_layer(k: int, n: int, per_channel: bool, generator: torch.Generator) -> DynamicQuantizedLinear:
    weight = torch.randn(n, k, generator=generator)  # [N, K]
    if per_channel:
        scales = weight.abs().amax(dim=1).double() / 127  # [N]
        q = torch.quantize_per_channel(weight, scales, torch.zeros(n, dtype=torch.long), 0, torch.qint8)
    else:
        q = torch.quantize_per_tensor(weight, float(weight.abs().max()) / 127, 0, torch.qint8)
    layer = DynamicQuantizedLinear(k, n, bias_=False, dtype=torch.qint8)
    layer.set_weight_bias(q, None)
    return layer

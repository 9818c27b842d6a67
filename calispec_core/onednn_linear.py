"""float32 (and bf16) Linear layers that multiply on oneDNN instead of torch's path, optionally on prepacked weights.

Why: the speculative verify forward multiplies every weight matrix by γ+1 rows. Through `F.linear`,
torch's CPU float32 path calls MKL: 2 to 16 rows go to MKL's SGEMM, which on AMD EPYCs (non-Intel
CPUs, where MKL does not pick its fast kernels; `MKL_ENABLE_INSTRUCTIONS` does not change that) runs a
compute-bound path: 7 rows of the 1536 -> 8960 MLP weight cost ~4-15x one row, and the whole float32
target forward grows almost linearly with new tokens. oneDNN's matmul on the same plain weight
(`torch.ops.mkldnn._linear_pointwise`) stays memory-bound for a few rows. On the AVX2-only EPYC of
wave 14 oneDNN also streams one row faster than MKL's GEMV (3.3 vs 5.0 ms for that weight read from
memory, ~17 GB/s against ~11), so every row count goes to oneDNN. See docs/performance.md, "float32
multi-token forward".

What: `use_onednn_linear(model)` swaps every float32 `nn.Linear` for a `OneDnnLinear` holding the
*same* weight and bias parameters (no copy, no re-layout: tied embeddings stay tied, memory stays
the same). With `packed=True` each layer also keeps its weight reordered once into oneDNN's blocked
layout for products of a few rows (`_reorder_linear_weight`), and 2+ row products run on it: 20-30 %
cheaper for 2-24 rows on that CPU, slower than the plain weight for one row (so one row keeps it), at
the price of a second copy of every float32 weight. Results equal `F.linear` within float32 rounding
(a different summation order), so greedy speculative decoding stays exact with respect to the served
model. `use_default_linear` undoes it (benchmarks compare the paths on one loaded model).

bf16 layers (wave 28), on CPUs with bf16 units (AVX512-BF16 or AMX): torch's own bf16 path
already calls oneDNN, but on the plain weight, whose products cost 1.4x one row's at 7 rows on the 2-core
AVX512-BF16 EPYC; on the packed weight every row count is cheaper, one row included (a scratch timing of
the 1.5B target's MLP weights, 2 threads: 32 / 44 ms plain against 26 / 24 ms packed for 1 / 7 rows), so
bf16 products of any row count run packed. docs/performance.md, "bf16 Linear layers on packed weights". Wave
30: a packed bf16 product of 1 or 2 rows of a large weight cost 1.13-1.26x one of 4 rows there (oneDNN picks
another kernel), so such products of fewer rows run as 4 (`PADDED_BF16_ROWS`): the target's 1- and 2-token
forwards cost 10 % and 15 % less.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from calispec_core.host_memory import available_bytes

log = logging.getLogger(__name__)

# oneDNN picks the packed layout for this many rows; 4 to 32 measured alike for 2-24 row products
# (docs/performance.md); a float32 row runs on the plain weight, a bf16 one on the packed (OneDnnLinear).
PACK_ROWS = 16
PACK_HEADROOM = 2.0  # `auto` packs where free memory holds the packed copy this many times over
# bf16 products of fewer rows run as this many (zero rows appended) on weights of PADDED_MIN_WEIGHTS values or
# more: on the AVX512-BF16 EPYC of wave 30 oneDNN's packed bf16 product of 1 or 2 rows cost 1.13-1.26x that of
# 4 for the 1.5B target's MLP and output layers (2 threads, weights streamed from memory), while its 1536 x 1536
# projections cost 6-17 % more padded; the target's 1- and 2-token forwards cost 10 % and 15 % less padded
PADDED_BF16_ROWS = 4
PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
PADDED_MIN_WEIGHTS = 1 << 22  # 4M: the target's MLP (13.8M) and output (233M) layers, not its q/k/v/o (<= 2.4M)


def onednn_linear_available() -> bool:
    """oneDNN is built in and usable on this CPU (torch's own switch, `torch.backends.mkldnn`)."""
    return torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled


def padded_rows_for(weight: torch.Tensor) -> int:
    """How many rows a packed product of fewer rows runs as, with this weight (0: as it is)."""
    large_bf16 = weight.dtype == torch.bfloat16 and weight.numel() >= PADDED_MIN_WEIGHTS
    return PADDED_BF16_ROWS if large_bf16 else 0


def packed_from_rows_for(weight: torch.Tensor) -> int:
    """Rows from which a product runs on the packed weight: one float32 row streams faster from the plain weight
    (the AVX2 EPYC of wave 14), one bf16 row from the packed one (the AVX512-BF16 EPYC of wave 28)."""
    return 1 if weight.dtype == torch.bfloat16 else 2


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [out, in] reordered into oneDNN's blocked layout for products of about PACK_ROWS rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)


class OneDnnLinear(nn.Module):
    """`nn.Linear` with the same parameters whose float32 (or bf16) CPU products run on oneDNN; with a packed
    copy of the weight, products of `packed_from_rows` rows or more run on that copy, and those of fewer than
    `padded_rows` rows (bf16, large weights) run as that many, zero rows appended (in a product bound by reading
    the weight the extra rows cost less than the faster kernel saves)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight  # the same Parameter object: ties and state_dict keys survive
        self.bias = linear.bias
        self.packed: torch.Tensor | None = None  # not a buffer: state_dict keeps the model's own keys
        self.use_packed = False
        self.packed_from_rows = packed_from_rows_for(linear.weight)
        self.padded_rows = padded_rows_for(linear.weight)  # packed products only

    def set_packed(self, on: bool) -> None:
        """Run products of `packed_from_rows` rows or more on the packed weight (packed once, kept while the
        module lives) or not."""
        if on and self.packed is None:
            self.packed = pack_weight(self.weight)
        self.use_packed = on

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> OneDnnLinear:
        """nn.Module's hook for .to(), .cuda(), .double()...: the packed copy is the old weight's. A new weight of
        the same dtype and device is packed again; another dtype or device drops the copy (packing a dtype is the
        swap's decision, set_fp32_linear_path), and products take torch's path where oneDNN has none."""
        before = (self.weight.dtype, self.weight.device, self.weight.data_ptr())
        super()._apply(fn, recurse)
        self.packed_from_rows, self.padded_rows = packed_from_rows_for(self.weight), padded_rows_for(self.weight)
        after = (self.weight.dtype, self.weight.device, self.weight.data_ptr())
        if after == before or self.packed is None:
            return self
        self.packed = None
        self.set_packed(self.use_packed and after[:2] == before[:2])
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if x.dtype != self.weight.dtype or x.device.type != "cpu" or x.dtype not in PACKABLE_DTYPES:
            return F.linear(x, self.weight, self.bias)
        rows = x.numel() // x.shape[-1]
        if not (self.use_packed and rows >= self.packed_from_rows):
            return _product(x, self.weight, self.bias)
        if rows >= self.padded_rows:
            return _product(x, self.packed, self.bias)
        flat = x.reshape(rows, x.shape[-1])  # [rows, in]
        padded = torch.cat([flat, flat.new_zeros(self.padded_rows - rows, flat.shape[1])])  # [padded_rows, in]
        return _product(padded, self.packed, self.bias)[:rows].reshape(*x.shape[:-1], self.out_features)

    def to_linear(self) -> nn.Linear:
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight = self.weight
        linear.bias = self.bias
        return linear

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"packed={self.use_packed}"
        )


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] times weight (plain [out, in] or packed) on oneDNN, plus bias: [..., out]."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _swap(model: nn.Module, wanted: Callable[[nn.Module], bool], make: Callable[[nn.Module], nn.Module]) -> int:
    targets = [(name, module) for name, module in model.named_modules() if wanted(module)]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, make(module))
    return len(targets)


def _dtypes(bf16: bool) -> tuple[torch.dtype, ...]:
    return PACKABLE_DTYPES if bf16 else (torch.float32,)


def packs(dtype: torch.dtype, bf16: bool) -> bool:
    """Whether `set_fp32_linear_path` may give CPU Linear layers of `dtype` a packed copy (`auto`: where it fits)."""
    return dtype in _dtypes(bf16) and onednn_linear_available()


def _cpu_linear(module: nn.Module, dtypes: tuple[torch.dtype, ...], kinds: tuple[type, ...] = (nn.Linear,)) -> bool:
    return type(module) in kinds and module.weight.dtype in dtypes and module.weight.device.type == "cpu"


def use_onednn_linear(model: nn.Module, packed: bool = False, bf16: bool = False) -> int:
    """Swap the float32 CPU `nn.Linear` layers of an inference model (bf16 ones too with `bf16`: only where
    oneDNN runs bf16) for `OneDnnLinear`, products on packed weights or not (layers swapped before switch
    too); returns how many layers run on oneDNN.

    Parameters stop requiring grad (the oneDNN op has no autograd formula; serving never trains).
    """
    if not onednn_linear_available():
        return 0
    model.requires_grad_(False)
    _swap(model, partial(_cpu_linear, dtypes=_dtypes(bf16)), OneDnnLinear)
    layers = [module for module in model.modules() if isinstance(module, OneDnnLinear)]
    for layer in layers:
        layer.set_packed(packed)
    return len(layers)


def packed_copy_bytes(model: nn.Module, bf16: bool = False) -> int:
    """What `packed=True` adds: one copy of every float32 CPU Linear weight (a tied one too; bf16 ones with
    `bf16`)."""
    dtypes = _dtypes(bf16)
    layers = [m for m in model.modules() if _cpu_linear(m, dtypes, (nn.Linear, OneDnnLinear))]
    return sum(layer.weight.numel() * layer.weight.element_size() for layer in layers)


def packed_copy_fits(need: int, available: int | None) -> bool:
    """`auto`'s choice: pack where `available` bytes hold the copy (`need`: packed_copy_bytes) PACK_HEADROOM times
    over, so as much again stays free for KV caches and whatever else shares the host (the other model service, a
    pod's limit)."""
    return need > 0 and available is not None and available >= PACK_HEADROOM * need


def set_fp32_linear_path(model: nn.Module, path: str, bf16: bool = False) -> str:
    """Put `model`'s float32 CPU Linear layers (and its bf16 ones with `bf16`: on CPUs with bf16 units) on `path`
    (limits.FP32_LINEAR_CHOICES; `auto`: packed where the copy fits, else onednn); returns the path they run,
    "" where the model has none (int8, CUDA; bf16 without `bf16`)."""
    need = packed_copy_bytes(model, bf16)
    if need == 0:
        return ""
    if path == "default" or not onednn_linear_available():
        return "default"
    available = available_bytes()
    packed = path == "packed" or (path == "auto" and packed_copy_fits(need, available))
    use_onednn_linear(model, packed=packed, bf16=bf16)
    resolved = "packed" if packed else "onednn"
    gib = 2**30
    free = "unknown" if available is None else f"{available / gib:.1f} GiB"
    log.info("Linear layers on %s (%s asked; a packed copy: %.1f GiB, available: %s)",
             resolved, path, need / gib, free)  # fmt: skip
    return resolved


def use_default_linear(model: nn.Module) -> int:
    """Undo `use_onednn_linear` (plain `nn.Linear` again, same parameters); returns how many."""
    return _swap(model, lambda module: isinstance(module, OneDnnLinear), OneDnnLinear.to_linear)

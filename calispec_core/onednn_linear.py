"""float32 Linear layers whose multi-row products run on oneDNN instead of MKL's sgemm.

Why: the speculative verify forward multiplies every weight matrix by γ+1 rows. Through
`F.linear`, torch's CPU float32 path calls MKL: one row goes to a memory-bound GEMV (fast), but
2 to 16 rows go to MKL's SGEMM, which on the AMD EPYC dev machine (a non-Intel CPU, where MKL does
not pick its fast kernels; `MKL_ENABLE_INSTRUCTIONS` does not change that) runs a compute-bound
path: 7 rows of the 1536 -> 8960 MLP weight cost ~15x one row, and the whole float32 target forward
grows almost linearly with new tokens. oneDNN's matmul on the same plain weight
(`torch.ops.mkldnn._linear_pointwise`) stays memory-bound for a few rows: 7 rows cost ~1.3x one row.
See docs/performance.md, "float32 multi-token forward".

What: `use_onednn_linear(model)` swaps every float32 `nn.Linear` for a `OneDnnLinear` holding the
*same* weight and bias parameters (no copy, no re-layout: tied embeddings stay tied, memory stays
the same). One row still takes `F.linear` (MKL's GEMV, as fast as anything here); more rows take
oneDNN. Results equal `F.linear` within float32 rounding (a different summation order), so greedy
speculative decoding stays exact with respect to the served model. `use_default_linear` undoes it
(benchmarks compare both on one loaded model).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def onednn_linear_available() -> bool:
    """oneDNN is built in and usable on this CPU (torch's own switch, `torch.backends.mkldnn`)."""
    return torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled


class OneDnnLinear(nn.Module):
    """`nn.Linear` with the same parameters; inputs of more than one row run on oneDNN (float32 CPU)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight  # the same Parameter object: ties and state_dict keys survive
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if x.numel() <= x.shape[-1] or x.dtype != torch.float32 or x.device.type != "cpu":
            return F.linear(x, self.weight, self.bias)  # one row: MKL's GEMV is memory-bound already
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")

    def to_linear(self) -> nn.Linear:
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight = self.weight
        linear.bias = self.bias
        return linear

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _swap(model: nn.Module, wanted: Callable[[nn.Module], bool], make: Callable[[nn.Module], nn.Module]) -> int:
    targets = [(name, module) for name, module in model.named_modules() if wanted(module)]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, make(module))
    return len(targets)


def _float32_cpu_linear(module: nn.Module) -> bool:
    return type(module) is nn.Linear and module.weight.dtype == torch.float32 and module.weight.device.type == "cpu"


def use_onednn_linear(model: nn.Module) -> int:
    """Swap the float32 CPU `nn.Linear` layers of an inference model for `OneDnnLinear`; returns how many.

    Parameters stop requiring grad (the oneDNN op has no autograd formula; serving never trains).
    """
    if not onednn_linear_available():
        return 0
    model.requires_grad_(False)
    return _swap(model, _float32_cpu_linear, OneDnnLinear)


def use_default_linear(model: nn.Module) -> int:
    """Undo `use_onednn_linear` (plain `nn.Linear` again, same parameters); returns how many."""
    return _swap(model, lambda module: isinstance(module, OneDnnLinear), OneDnnLinear.to_linear)

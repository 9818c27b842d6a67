"""Sends each task to each decoding variant through the client SDK, and reads the correction memory.

Variants interleave per task (task 1 in every mode, then task 2, ...), so drift of the machine
hits all alike. Requests run one at a time (batch 1, as in the paper's speed figures).
Note: the correction memory learns online from every request of the run, so later tasks meet a
fuller memory; the run order is part of the configuration in the JSON.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from calispec.client import CalispecClient, CalispecRpcError
from calispec_tools.eval.scorers import SandboxLimits, score
from calispec_tools.eval.tasks import Task, render

PAPER_MODES = ("ar", "sd", "csd", "ocm_only", "scg_only")


@dataclass(frozen=True)
class Variant:
    mode: str
    tau: float | None = None  # None: the server's default
    lambda_: int | None = None

    @property
    def label(self) -> str:
        extra = [f"τ={self.tau:g}"] if self.tau is not None else []
        extra += [f"λ={self.lambda_}"] if self.lambda_ is not None else []
        return " ".join([self.mode, *extra])


def variants(modes: Sequence[str], taus: Sequence[float] = (), lambdas: Sequence[int] = ()) -> list[Variant]:
    """The modes at server defaults, plus csd at every τ × λ of a sweep (a missing axis stays at default;
    the cell at both defaults is plain `csd` when that mode runs anyway)."""
    from calispec_core.generation import Defaults  # lazily: `calispec --help` imports this module, not torch

    out = [Variant(m) for m in modes]
    for tau, lam in itertools.product(taus or [None], lambdas or [None]) if taus or lambdas else []:
        if "csd" in modes and tau in (None, Defaults.tau) and lam in (None, Defaults.lambda_):
            continue
        out.append(Variant("csd", tau, lam))
    return out


@dataclass(frozen=True)
class EvalConfig:
    max_new_tokens: int = 256
    gamma: int | None = None
    prompt_format: str = "raw"
    timeout_s: float = 300.0
    sandbox_timeout_s: float = 10.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_one(client: CalispecClient, task: Task, variant: Variant, config: EvalConfig) -> dict[str, Any]:
    prompt, stop = render(task, config.prompt_format)
    row: dict[str, Any] = {"task": task.id, "kind": task.kind, "variant": variant.label, **asdict(variant)}
    start = time.perf_counter()
    try:
        result = client.generate(
            prompt, timeout=config.timeout_s, mode=variant.mode, tau=variant.tau, lambda_=variant.lambda_,
            max_new_tokens=config.max_new_tokens, num_speculative_tokens=config.gamma, stop=list(stop),
        )  # fmt: skip
    except CalispecRpcError as exc:
        return {**row, "error": exc.code, "correct": False, "status": "error", "output": "", "stats": None}
    row["wall_s"] = time.perf_counter() - start
    correct, status = score(task, result.text, SandboxLimits(timeout_s=config.sandbox_timeout_s))
    return {
        **row, "error": None, "correct": correct, "status": status, "output": result.text,
        "finish_reason": result.finish_reason, "stats": result.stats.to_dict(),
    }  # fmt: skip


def run_eval(
    address: str,
    tasks: Sequence[Task],
    variant_list: Sequence[Variant],
    config: EvalConfig,
    on_done: Callable[[dict[str, Any]], None] = lambda row: None,
    client_options: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """`client_options`: CalispecClient's token / tls_ca / tls_server_name."""
    rows = []
    with CalispecClient(address, timeout=config.timeout_s, **(client_options or {})) as client:
        for task in tasks:
            for variant in variant_list:
                row = run_one(client, task, variant, config)
                rows.append(row)
                on_done(row)
    return rows

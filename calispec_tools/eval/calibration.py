"""Calibration study: csd with no calibration vs calibration on a general corpus vs task-specific.

The paper: a universal calibration set gives the same speedup as task-specific calibration, and with
none at all the online updates alone still raise acceptance. Each variant gets a fresh stack with its
own memory database and namespace (a target reads one namespace per process, so a shared stack would
leak counts between variants), is calibrated the way `calispec calibrate` does it (standard SD through
the stack; the target counts every rejection event), then runs the eval tasks in `ar` and `csd`
(`ar` in the same stack is the speedup's baseline, so stack-to-stack drift cancels).

`calibration_prompts`, `summarize_study` are pure; `run_study` drives stacks through a factory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from calispec.client import CalispecClient
from calispec_tools.bench.prompts import BUILTIN_DIR, Prompt, load_jsonl
from calispec_tools.eval.report import summarize
from calispec_tools.eval.runner import EvalConfig, Variant, run_eval
from calispec_tools.eval.tasks import Task, qwen_chat
from calispec_tools.memory_reads import memory_events, wait_for_events

STUDY_VARIANTS = ("none", "general", "task")
GENERAL_SET = "prose"  # the shipped summarisation-style prose stands in for a general corpus
STUDY_MODES = (Variant("ar"), Variant("csd"))


@dataclass(frozen=True)
class StudyEndpoints:
    coordinator: str
    memory: str
    namespace: str


# (variant label) -> a fresh stack for it, stopped when the block exits
StackFactory = Callable[[str], AbstractContextManager[StudyEndpoints]]


def calibration_prompts(
    variant: str, kinds: Sequence[str], per_kind: int | None = None, prompt_format: str = "raw"
) -> list[Prompt]:
    """The calibration set of a variant: none; the general set; or the prompt sets of the task kinds.

    General and task-specific get the same number of prompts (per_kind × kinds, as far as the general
    set reaches), so the comparison is about the text, not the amount."""
    if variant == "none":
        return []
    if variant == "general":
        prompts = load_jsonl(BUILTIN_DIR / f"{GENERAL_SET}.jsonl")
        prompts = prompts[: per_kind * len(kinds)] if per_kind is not None else prompts
    elif variant == "task":
        prompts = [p for kind in kinds for p in load_jsonl(BUILTIN_DIR / f"{kind}.jsonl")[:per_kind]]
    else:
        raise ValueError(f"calibration variant must be one of {STUDY_VARIANTS}, got {variant!r}")
    if prompt_format == "qwen-chat":  # calibrate in the format the tasks are asked in
        prompts = [Prompt(qwen_chat(p.text), p.max_new_tokens, p.source) for p in prompts]
    return prompts


def calibrate(ep: StudyEndpoints, prompts: Sequence[Prompt], config: EvalConfig) -> int:
    """Standard SD over the prompts (as `calispec calibrate`); returns the rejection events recorded.
    Waits until the memory service holds them, so the table is complete before the tasks start."""
    if not prompts:
        return 0
    before = memory_events(ep.memory, ep.namespace)
    rejections = 0
    with CalispecClient(ep.coordinator, timeout=config.timeout_s) as client:
        for p in prompts:
            budget = min(p.max_new_tokens or config.max_new_tokens, config.max_new_tokens)
            result = client.generate(
                p.text, mode="sd", max_new_tokens=budget, num_speculative_tokens=config.gamma, timeout=config.timeout_s
            )
            rejections += result.stats.rejections
    return wait_for_events(ep.memory, ep.namespace, before + rejections) - before


def run_study(
    start_stack: StackFactory,
    tasks: Sequence[Task],
    config: EvalConfig,
    per_kind: int | None = None,
    on_done: Callable[[dict[str, Any]], None] = lambda row: None,
) -> dict[str, Any]:
    """Every variant on its own fresh stack: calibrate, then the tasks in ar and csd. Rows carry `calibration`."""
    kinds = list(dict.fromkeys(t.kind for t in tasks))
    rows: list[dict[str, Any]] = []
    calibration: dict[str, dict[str, Any]] = {}
    for variant in STUDY_VARIANTS:
        prompts = calibration_prompts(variant, kinds, per_kind, config.prompt_format)
        with start_stack(variant) as ep:
            events = calibrate(ep, prompts, config)
            calibration[variant] = {"prompts": len(prompts), "events": events, "namespace": ep.namespace}
            variant_rows = run_eval(ep.coordinator, tasks, STUDY_MODES, config, on_done)
        rows += [{**r, "calibration": variant} for r in variant_rows]
    return {"summary": summarize_study(rows, calibration), "calibration": calibration, "rows": rows}


def summarize_study(rows: Sequence[dict[str, Any]], calibration: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per calibration variant: csd's accuracy, acceptance, rescue rate, speedup vs the same stack's ar.

    rescue rate = rescued / rejection events: the share of the standard rule's rejections CSD kept."""
    out: dict[str, Any] = {}
    for variant, info in calibration.items():
        mine = [r for r in rows if r["calibration"] == variant]
        csd = summarize(mine)["csd"]
        rejections = sum(r["stats"]["rejections"] for r in mine if r["variant"] == "csd" and r["stats"])
        out[variant] = {
            "calibration_prompts": info["prompts"], "calibration_events": info["events"],
            "accuracy": csd["accuracy"], "acceptance_rate": csd["acceptance_rate"],
            "rescued": csd["rescued"], "rejections": rejections,
            "rescue_rate": csd["rescued"] / rejections if rejections else float("nan"),
            "speedup_vs_ar": csd["speedup_vs_ar"], "tokens_per_s": csd["tokens_per_s"],
            "accuracy_by_kind": csd["accuracy_by_kind"],
        }  # fmt: skip
    return out

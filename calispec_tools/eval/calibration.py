"""Calibration study: every decoding mode with no calibration, the shipped calibration, task-like calibration.

Each calibration variant gets a fresh stack with its own memory database (a shared stack would
leak counts between variants), is calibrated teacher-forced (calispec_tools/calibrate/: the models
in this process, the events written through the memory service's authenticated RecordEvents), then
runs the tasks: every mode on the reference calibration (shipped), only the modes that read the
memory (csd, ocm_only) on the others (`study_plan`); `ar` of the same stack, else of the reference,
is the speedup's baseline. The memory's rejection concentration (share of events held by the top x% of pairs)
is read right after calibrating and again after the tasks (the online updates of the run), with the
events the memory's caps dropped (recorded but evicted: at most max_pairs_per_draft targets per draft token).

- none: an empty memory (online updates only);
- shipped: the pair's shipped export file if it has one (calispec_tools/data/calibration/), else the
  same pipeline over the corpus the repo carries, run here;
- task: only the corpus files in the tasks' own formats (raw function stubs for code, "Question: ...
  Answer:" for math; tests/unit/test_calibration_corpus.py guards that none is an evaluation task),
  continued by the target (--generate): task-like text. (The bench's prompt sets in data/prompts/
  hold near copies of evaluation tasks, so they are never a calibration source.)

`calibration_documents`, `summarize_study` are pure; `run_study` drives stacks through a factory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from calispec_tools.calibrate.corpus import Document, load_corpus
from calispec_tools.cli_auth import own_stack_auth
from calispec_tools.eval.rejections import analyse
from calispec_tools.eval.report import summarize
from calispec_tools.eval.runner import EvalConfig, Variant, run_eval
from calispec_tools.eval.tasks import Task, qwen_chat
from calispec_tools.memory_reads import TableRead, read_table, wait_for_events
from calispec_tools.shipped_calibration import CORPUS_DIR

STUDY_VARIANTS = ("none", "shipped", "task")
MEMORY_READING_MODES = ("csd", "ocm_only")  # ar, sd and scg_only never consult the correction memory


@dataclass(frozen=True)
class StudyEndpoints:
    coordinator: str
    memory: str
    namespace: str
    writer_token: str  # the stack's verifier credential: calibration writes as verifiers do


# (variant label) -> a fresh stack for it, stopped when the block exits
StackFactory = Callable[[str], AbstractContextManager[StudyEndpoints]]
# (variant label, its fresh stack) -> what the calibration did (events, pairs, seconds, source)
TASK_LIKE_FILES = {"code": "code_stubs.jsonl", "math": "math_problems.jsonl"}  # under the calibration corpus
CalibrateFn = Callable[[str, StudyEndpoints], dict[str, Any]]


def calibration_documents(
    variant: str, kinds: Sequence[str], per_kind: int | None = None, prompt_format: str = "raw"
) -> list[Document]:
    """The teacher-forced calibration set of a variant ("shipped" without a shipped file: the repo's corpus)."""
    if variant == "none":
        return []
    if variant == "shipped":
        return load_corpus(CORPUS_DIR)
    if variant != "task":
        raise ValueError(f"calibration variant must be one of {STUDY_VARIANTS}, got {variant!r}")
    prompts = [d for kind in kinds for d in load_corpus(CORPUS_DIR / TASK_LIKE_FILES[kind])[:per_kind]]
    chat = prompt_format == "qwen-chat"  # calibrate in the format the tasks are asked in
    return [Document(qwen_chat(d.text) if chat else d.text, True, d.source) for d in prompts]


def concentration(ep: StudyEndpoints) -> dict[str, Any]:
    """The memory's rejection concentration now (coverage curve, top-20% share) and what its caps dropped."""
    return table_report(read_table(ep.memory, ep.namespace))


def table_report(table: TableRead) -> dict[str, Any]:
    """`events` are the table's (what CSD reads); `recorded_events` all ever written, `dropped_events` the
    difference: a draft token keeps at most `max_pairs_per_draft` targets and the table `max_pairs` pairs, so a
    write past a cap evicts its lowest-counted pairs (and decay, when on, halves counts)."""
    doc = analyse(table.pairs)
    caps = {
        "max_pairs": table.max_pairs,
        "max_pairs_per_draft": table.max_pairs_per_draft,
        "half_life_s": table.half_life_s,
    }
    return {
        **{k: doc[k] for k in ("distinct_pairs", "events", "top20_share", "coverage_curve")},
        "recorded_events": table.recorded_events,
        "dropped_events": table.dropped_events,
        "caps": caps,
    }


def reference_calibration(calibrations: Sequence[str]) -> str:
    """The calibration that runs every variant: "shipped" when studied, else the first."""
    return "shipped" if "shipped" in calibrations else calibrations[0]


def study_plan(calibrations: Sequence[str], variant_list: Sequence[Variant]) -> dict[str, list[Variant]]:
    """The variants each calibration runs, in per-task order.

    ar, sd and scg_only never read the memory: their outputs are the same under every calibration, so
    they (and the τ × λ sweep) run once, on the reference calibration; the others run the memory-reading
    modes at their defaults. Memory-reading variants go first in each task, so CSD never meets events
    that another mode wrote for the same task (ocm_only, after csd, meets csd's)."""
    reads = [v for v in variant_list if v.mode in MEMORY_READING_MODES]
    plan = {}
    for label in calibrations:
        if label == reference_calibration(calibrations):
            plan[label] = reads + [v for v in variant_list if v.mode not in MEMORY_READING_MODES]
        else:
            plan[label] = [v for v in reads if v.tau is None and v.lambda_ is None]
    return plan


def run_study(
    start_stack: StackFactory,
    calibrate: CalibrateFn,
    tasks: Sequence[Task],
    variants: Sequence[Variant],
    config: EvalConfig,
    on_done: Callable[[dict[str, Any]], None] = lambda row: None,
    calibrations: Sequence[str] = STUDY_VARIANTS,
) -> dict[str, Any]:
    """Every calibration on its own fresh stack: calibrate, then the tasks in its variants (rows carry it).
    The stacks are the study's own (open on loopback): its clients take no credentials from the environment."""
    rows: list[dict[str, Any]] = []
    info: dict[str, dict[str, Any]] = {}
    for label, label_variants in study_plan(calibrations, variants).items():
        with start_stack(label) as ep:
            info[label] = {**calibrate(label, ep), "namespace": ep.namespace, "before": concentration(ep)}
            variant_rows = run_eval(ep.coordinator, tasks, label_variants, config, on_done, own_stack_auth())
            # verifiers ship a request's rejection events a sync interval after its reply: wait for the last ones
            ran = sum(r["stats"]["rejections"] for r in variant_rows if r["stats"])
            wait_for_events(ep.memory, ep.namespace, info[label]["before"]["recorded_events"] + ran)
            info[label]["after"] = concentration(ep)
        rows += [{**r, "calibration": label} for r in variant_rows]
    order = [v.label for v in variants]
    return {"summary": summarize_study(rows, info, order), "calibration": info, "rows": rows}


def summarize_study(
    rows: Sequence[dict[str, Any]], calibration: dict[str, dict[str, Any]], order: Sequence[str] = ()
) -> dict[str, Any]:
    """Per calibration: every variant's summary (in `order`, else first-seen) plus its rescue rate; speedup
    against the same stack's ar, or the reference calibration's where this stack ran none (one run, same machine).

    rescue rate = rescued / rejection events: the share of the standard rule's rejections CSD kept."""
    out: dict[str, Any] = {}
    rank = {label: i for i, label in enumerate(order)}
    for label in calibration:
        summary = summarize([r for r in rows if r["calibration"] == label])
        out[label] = dict(sorted(summary.items(), key=lambda item: rank.get(item[0], len(rank))))
    reference = reference_calibration(list(calibration)) if calibration else None
    base = out.get(reference, {}).get("ar", {}).get("tokens_per_s", math.nan)
    for per_variant in out.values():
        own = per_variant.get("ar", {}).get("tokens_per_s", base)
        for s in per_variant.values():
            s["speedup_vs_ar"] = s["tokens_per_s"] / own if own and not math.isnan(own) else math.nan
            s["rescue_rate"] = s["rescued"] / s["rejections"] if s["rejections"] else float("nan")
    return out

"""`calispec bench calibration`: teacher-forced calibration against calibrating by SD through the stack.

One run, one machine, the same prompts: first greedy SD through a fresh local stack at a fixed γ
(the old way: the target records every rejection), then, with the stack stopped, the teacher-forced
pipeline in this process over the same prompts (`--generate --events sd`: the same events, see
docs/calibration.md) and over the shipped corpus's text documents (`dense`). It prints events/s of
each and the ratio to SD through the stack, with the machine's CPU flags, dtypes, threads and torch.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calispec_tools.calibrate.corpus import Document, load_corpus
from calispec_tools.cli_auth import own_stack_auth

if TYPE_CHECKING:
    from calispec_tools.stack import LocalStack

CORPUS = Path(__file__).resolve().parent.parent / "data" / "calibration" / "corpus"


@dataclass(frozen=True)
class Method:
    label: str
    events: int
    positions: int  # tokens decoded (SD) or predictions compared (teacher-forced)
    seconds: float
    pairs: Counter[tuple[int, int]] = field(default_factory=Counter)  # (draft, target) -> events

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


def benchmark_prompts(count: int, corpus: Path = CORPUS) -> list[str]:
    """`count` prompts of the shipped corpus, taken round-robin over its prompt files (code, math, chat)."""
    by_source: dict[str, list[str]] = {}
    for doc in load_corpus(corpus):
        if doc.is_prompt:
            by_source.setdefault(doc.source.rsplit(":", 1)[0], []).append(doc.text)  # source is "path:line"
    lists = list(by_source.values())
    picked = [lst[i] for i in range(max(len(lst) for lst in lists)) for lst in lists if i < len(lst)]
    return picked[:count]


def text_documents(corpus: Path = CORPUS) -> list[Document]:
    return [d for d in load_corpus(corpus) if not d.is_prompt]


def sd_through_stack(stack: LocalStack, prompts: list[str], gamma: int, max_new_tokens: int) -> Method:
    """Greedy SD, one request at a time, a fixed γ: every rejection is an event the target records
    (in the stack's fresh memory: the run's pairs are read back from it, less the warm-up's)."""
    from calispec.client import CalispecClient

    events = tokens = 0
    with CalispecClient(stack.coordinator_address, timeout=900, **own_stack_auth()) as client:
        warm = client.generate(prompts[0], mode="sd", max_new_tokens=4, num_speculative_tokens=gamma)
        before = recorded_pairs(stack, warm.stats.rejections)
        start = time.perf_counter()
        for i, prompt in enumerate(prompts, 1):
            result = client.generate(prompt, mode="sd", max_new_tokens=max_new_tokens, num_speculative_tokens=gamma)
            events += result.stats.rejections
            tokens += len(result.token_ids)
            print(f"  SD [{i}/{len(prompts)}] {result.stats.rejections} rejections", file=sys.stderr)
        seconds = time.perf_counter() - start
    pairs = recorded_pairs(stack, warm.stats.rejections + events) - before
    return Method(f"SD through the stack (γ={gamma})", events, tokens, seconds, pairs)


def recorded_pairs(stack: LocalStack, at_least: int) -> Counter[tuple[int, int]]:
    """The pairs in the stack's memory once it holds `at_least` events (verifiers ship them a sync later)."""
    from calispec_tools.memory_reads import read_table, wait_for_events

    wait_for_events(stack.memory_address, stack.memory_namespace, at_least)
    return Counter({(d, t): n for d, t, n in read_table(stack.memory_address, stack.memory_namespace).pairs})


def agreement(reference: Counter[tuple[int, int]], other: Counter[tuple[int, int]]) -> str:
    """How many of the reference's events `other` holds too (the same pair, counted at most as often)."""
    shared = sum((reference & other).values())
    total = sum(reference.values())
    share = f"{shared / total:.1%}" if total else "-"
    return f"{shared} of the SD run's {total} events ({share}); {sum(other.values()) - shared} others"


def teacher_forced(
    args: argparse.Namespace, draft_dtype: str, prompts: list[str], texts: list[Document]
) -> list[Method]:
    from calispec_core.limits import INT8_SPLIT
    from calispec_tools.calibrate.job import CalibrateConfig, Calibrator, load_pair

    draft_dir, target_dir = args.model_dirs
    outliers = args.int8_outliers or INT8_SPLIT
    draft, target = load_pair(draft_dir, target_dir, args.dtype, args.device, draft_dtype, outliers)
    docs = [Document(p, True, "bench") for p in prompts]
    sd = CalibrateConfig(mode="sd", generate=True, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                         batch_size=args.batch_size)  # fmt: skip
    Calibrator(draft, target, CalibrateConfig(mode="sd", generate=True, max_new_tokens=2)).run(docs[:1])  # warm-up
    methods = []
    summary = Calibrator(draft, target, sd).run(docs)
    methods.append(
        Method("teacher-forced --generate (sd)", summary.events, summary.positions, summary.total_s, summary.pairs)
    )
    if texts:
        dense = CalibrateConfig(mode="dense", max_tokens=args.max_tokens, batch_size=args.batch_size)
        summary = Calibrator(draft, target, dense).run(texts)
        methods.append(Method("teacher-forced text (dense)", summary.events, summary.positions, summary.total_s))
    return methods


def format_report(env: dict[str, Any], methods: list[Method]) -> str:
    base = methods[0].events_per_s
    lines = ["environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), ""]
    lines.append(f"{'method':34s} {'events':>7s} {'positions':>9s} {'seconds':>8s} {'events/s':>9s} {'× SD':>7s}")
    for m in methods:
        ratio = m.events_per_s / base if base else float("nan")
        lines.append(f"{m.label:34s} {m.events:7d} {m.positions:9d} {m.seconds:8.1f} {m.events_per_s:9.2f} "
                     f"{ratio:7.1f}")  # fmt: skip
    if len(methods) > 1 and methods[0].pairs and methods[1].pairs:
        lines += ["", f"same events: {methods[1].label} holds " + agreement(methods[0].pairs, methods[1].pairs)]
    return "\n".join(lines)


def run_calibration_bench(args: argparse.Namespace) -> int:
    from calispec_tools.bench.compare import cpu_flags, isa_caps
    from calispec_tools.cli import served_draft_dtype
    from calispec_tools.stack import LocalStack, StackConfig, service_threads, threads_label

    prompts = benchmark_prompts(args.prompts)
    texts = [] if args.no_text else text_documents()
    draft, target = args.model_dirs
    draft_dtype = served_draft_dtype(args)
    with tempfile.TemporaryDirectory(prefix="calispec-bench-calibration-") as tmp:
        config = StackConfig(
            draft_model=draft, target_model=target, memory_db=Path(tmp) / "memory.db", log_dir=Path(tmp) / "logs",
            coordinator_port=0, target_port=0, draft_port=0, memory_port=0, dtype=args.dtype, device=args.device,
            draft_dtype=draft_dtype, draft_threads=args.draft_threads,
            target_threads=args.target_threads, compute_lock=not args.no_compute_lock,
            int8_outliers=args.int8_outliers,
        )  # fmt: skip
        threads = service_threads(config)
        print(f"SD through a local stack over {len(prompts)} prompts...", file=sys.stderr)
        with LocalStack(config) as stack:
            methods = [sd_through_stack(stack, prompts, args.gamma, args.max_new_tokens)]
    print("teacher-forced in this process (the stack is stopped)...", file=sys.stderr)
    methods += teacher_forced(args, draft_dtype, prompts, texts)
    import torch

    env = {
        "cpu_flags": cpu_flags(), "isa_caps": isa_caps(), "torch": torch.__version__, "device": args.device,
        "dtype": args.dtype,
        "draft_dtype": draft_dtype, "stack_threads": [threads_label(t) for t in threads],
        "process_threads": torch.get_num_threads(),
        "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "gamma": args.gamma,
        "batch_size": args.batch_size, "int8_outliers": args.int8_outliers or "split (the services' default)",
    }  # fmt: skip
    print(format_report(env, methods))
    return 0

"""`calispec bench calibration`: teacher-forced calibration against calibrating by SD through the stack.

One run, one machine, the same prompts, interleaved: the prompts are split into rounds, and each round runs greedy
SD through a local stack at a fixed γ on its share (the old way: the target records every rejection), then, in this
process beside the idle stack, the teacher-forced pipeline over the same share (`--generate --events sd`: the same
events, see docs/calibration.md) and over the shipped corpus's whole text (`dense`, the same batches every round).
A machine whose speed drifts between minutes then slows both sides of the ratio alike. Where the pair does not fit
twice in memory, SD's rounds run first and teacher forcing after them with the stack stopped (the order before wave
47), and the report says so. It prints events/s of each, the ratio to SD through the stack over all rounds and per
round, with the machine's CPU flags, dtypes, threads and torch.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calispec_core.host_memory import GIB, LOW_MEMORY
from calispec_tools.calibrate.corpus import Document, load_corpus
from calispec_tools.cli_auth import own_stack_auth

if TYPE_CHECKING:
    from calispec.client import CalispecClient
    from calispec_tools.calibrate.job import Calibrator
    from calispec_tools.stack import LocalStack, StackConfig

CORPUS = Path(__file__).resolve().parent.parent / "data" / "calibration" / "corpus"
SD_LABEL = "SD through the stack (γ={gamma})"
GENERATE_LABEL = "teacher-forced --generate (sd)"
DENSE_LABEL = "teacher-forced text (dense)"


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


def combined(label: str, parts: Sequence[Method]) -> Method:
    """One method's rounds as one run: events, positions, seconds and pairs summed."""
    pairs: Counter[tuple[int, int]] = Counter()
    for part in parts:
        pairs.update(part.pairs)
    return Method(label, sum(p.events for p in parts), sum(p.positions for p in parts),
                  sum(p.seconds for p in parts), pairs)  # fmt: skip


def split_rounds(prompts: list[str], rounds: int) -> list[list[str]]:
    """The prompts in `rounds` consecutive shares, as even as they go (never an empty share)."""
    rounds = min(rounds, len(prompts))
    size, extra = divmod(len(prompts), rounds)
    bounds = [i * size + min(i, extra) for i in range(rounds + 1)]
    return [prompts[a:b] for a, b in pairwise(bounds)]


# Teacher forcing beyond its weights and the draft's float32 load (whose memory its heap reuses): the batches'
# activations and logits. A bf16 pair on the AMX VM took ~7.3 GiB in all, its estimate below 10.0 (wave 47).
TEACHER_MARGIN = 1 * GIB


def safetensors_parameters(model_dir: Path) -> int | None:
    """The parameters stored in a model directory's safetensors files (their headers only); None where it has none
    (another format: its size is not known here)."""
    import math

    from safetensors import safe_open

    paths = sorted(Path(model_dir).glob("*.safetensors"))
    total = 0
    for path in paths:
        with safe_open(path, framework="pt") as f:  # the header only: no tensor is read
            names = f.keys()  # safe_open cannot be iterated itself
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in names)
    return total if paths else None


def teacher_forcing_bytes(draft: Path, target: Path, target_bytes: int, target_copies: int) -> int | None:
    """What the teacher-forced pair takes in this process: the target in its dtype (`target_copies` 2 where its
    Linear weights get a packed copy), the draft in float32 (an int8 draft is loaded so, then quantised), and
    TEACHER_MARGIN; None where a size is unknown."""
    target_params, draft_params = safetensors_parameters(target), safetensors_parameters(draft)
    if target_params is None or draft_params is None:
        return None
    return target_params * target_bytes * target_copies + draft_params * 4 + TEACHER_MARGIN


def interleaving(rounds: int, need: int | None, available: int | None) -> tuple[bool, str]:
    """Whether the rounds can interleave (the pair loaded here beside the stack's, `need` bytes more, with
    LOW_MEMORY to spare), and the report's words for it. Otherwise SD runs its rounds first and teacher forcing
    follows with the stack stopped, as before wave 47: a host short of memory slows both sides unevenly."""
    if rounds == 1:
        return False, "1"
    if need is not None and available is not None and available >= need + LOW_MEMORY:
        return True, f"{rounds} (interleaved: ~{need / GIB:.1f} GiB beside the stack, {available / GIB:.1f} available)"
    wants = "an unknown size" if need is None else f"~{need / GIB:.1f} GiB"
    free = "unknown" if available is None else f"{available / GIB:.1f} GiB"
    return False, (f"{rounds} of SD, then teacher forcing with the stack stopped (not interleaved: the pair here "
                   f"needs {wants} beside the stack, {free} available)")  # fmt: skip


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


class StackSd:
    """Greedy SD, one request at a time, a fixed γ: every rejection is an event the target records (in the
    stack's fresh memory: the run's pairs are read back from it at the end, less the warm-up's)."""

    def __init__(
        self, stack: LocalStack, client: CalispecClient, gamma: int, max_new_tokens: int, warm: str, total: int
    ) -> None:
        self.stack, self.client, self.gamma, self.max_new_tokens = stack, client, gamma, max_new_tokens
        self.warm_events = self._generate(warm, max_new_tokens=4).stats.rejections
        self.before = recorded_pairs(stack, self.warm_events)
        self.events = self.requests = 0
        self.total = total  # prompts over every round, for the progress lines

    def _generate(self, prompt: str, max_new_tokens: int) -> Any:
        return self.client.generate(prompt, mode="sd", max_new_tokens=max_new_tokens,
                                    num_speculative_tokens=self.gamma)  # fmt: skip

    def run(self, prompts: list[str]) -> Method:
        events = tokens = 0
        start = time.perf_counter()
        for prompt in prompts:
            result = self._generate(prompt, self.max_new_tokens)
            events += result.stats.rejections
            tokens += len(result.token_ids)
            self.requests += 1
            print(f"  SD [{self.requests}/{self.total}] {result.stats.rejections} rejections", file=sys.stderr)
        self.events += events
        return Method(SD_LABEL.format(gamma=self.gamma), events, tokens, time.perf_counter() - start)

    def pairs(self) -> Counter[tuple[int, int]]:
        """Every round's pairs, read back from the stack's memory."""
        return recorded_pairs(self.stack, self.warm_events + self.events) - self.before


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


class TeacherForced:
    """The teacher-forced pipeline in this process: the pair loaded once, as `calispec calibrate` loads it."""

    def __init__(self, args: argparse.Namespace, draft_dtype: str, warm: str) -> None:
        from calispec_core.limits import INT8_SPLIT
        from calispec_tools.calibrate.job import CalibrateConfig, Calibrator, load_pair

        draft_dir, target_dir = args.model_dirs
        outliers = args.int8_outliers or INT8_SPLIT
        draft, target = load_pair(draft_dir, target_dir, args.dtype, args.device, draft_dtype, outliers)
        scales = args.int8_scales
        sd = CalibrateConfig(mode="sd", generate=True, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                             batch_size=args.batch_size, int8_scales=scales)  # fmt: skip
        dense = CalibrateConfig(mode="dense", max_tokens=args.max_tokens, batch_size=args.batch_size,
                                int8_scales=scales)  # fmt: skip
        self.sd, self.dense = Calibrator(draft, target, sd), Calibrator(draft, target, dense)
        self.target_linear = target.fp32_linear or "-"  # packed where the memory left held the copy (`auto`)
        warm_up = CalibrateConfig(mode="sd", generate=True, max_new_tokens=2, int8_scales=scales)
        Calibrator(draft, target, warm_up).run([Document(warm, True, "bench")])

    def generate(self, prompts: list[str]) -> Method:
        return _measured(GENERATE_LABEL, self.sd, [Document(p, True, "bench") for p in prompts])

    def text(self, texts: list[Document]) -> Method:
        return _measured(DENSE_LABEL, self.dense, texts)


def _measured(label: str, calibrator: Calibrator, docs: list[Document]) -> Method:
    summary = calibrator.run(docs)
    return Method(label, summary.events, summary.positions, summary.total_s, summary.pairs)


def format_report(env: dict[str, Any], methods: list[Method], rounds: Sequence[Sequence[Method]] = ()) -> str:
    """The methods over the whole run, each with its ratio to the first (SD through the stack); then, where the
    run had several rounds, each round's events/s and ratios (the spread is the machine's drift)."""
    base = methods[0].events_per_s
    lines = ["environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), ""]
    lines.append(f"{'method':34s} {'events':>7s} {'positions':>9s} {'seconds':>8s} {'events/s':>9s} {'× SD':>7s}")
    for m in methods:
        ratio = m.events_per_s / base if base else float("nan")
        lines.append(f"{m.label:34s} {m.events:7d} {m.positions:9d} {m.seconds:8.1f} {m.events_per_s:9.2f} "
                     f"{ratio:7.1f}")  # fmt: skip
    if len(rounds) > 1:
        lines += ["", "by round (events/s; × SD: of that round's SD):"]
        for i, parts in enumerate(rounds, 1):
            sd = parts[0].events_per_s
            cells = [f"SD {sd:.2f}"] + [_round_cell(p, sd) for p in parts[1:]]
            lines.append(f"  round {i}: " + ", ".join(cells))
    if len(methods) > 1 and methods[0].pairs and methods[1].pairs:
        lines += ["", f"same events: {methods[1].label} holds " + agreement(methods[0].pairs, methods[1].pairs)]
    return "\n".join(lines)


def _round(
    i: int, shares: list[list[str]], stack_sd: StackSd, teacher: TeacherForced, texts: list[Document]
) -> list[Method]:
    """One interleaved round: SD through the stack on its share, then teacher forcing on it and the whole text."""
    print(f"round {i + 1}/{len(shares)}: SD through the stack over {len(shares[i])} prompts, then teacher-forced "
          "in this process", file=sys.stderr)  # fmt: skip
    parts = [stack_sd.run(shares[i]), teacher.generate(shares[i])]
    return parts + ([teacher.text(texts)] if texts else [])


def teacher_memory(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """(bytes teacher forcing needs, bytes free) on the device it computes on: host memory on CPU, where a float32
    target (and a bf16 one on CPUs with bf16 units) gets a packed copy of its Linear weights (`auto`, as the
    services); the GPU's free memory on CUDA."""
    import torch

    from calispec_core.host_memory import available_bytes
    from calispec_core.modeling import cpu_has_fast_bf16, resolve_device, resolve_dtype
    from calispec_core.onednn_linear import packs

    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    packed = device.type == "cpu" and packs(dtype, bf16=cpu_has_fast_bf16())  # as ModelRunner asks
    draft, target = args.model_dirs
    need = teacher_forcing_bytes(draft, target, dtype.itemsize, 2 if packed else 1)
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else available_bytes()
    return need, free


def _round_cell(method: Method, sd_events_per_s: float) -> str:
    name = method.label.removeprefix("teacher-forced ")
    ratio = f" ({method.events_per_s / sd_events_per_s:.1f}×)" if sd_events_per_s else ""
    return f"{name} {method.events_per_s:.2f}{ratio}"


def _stack_config(args: argparse.Namespace, tmp: Path, draft_dtype: str) -> StackConfig:
    """A fresh local stack of the bench's pair on free ports, its memory and logs in `tmp`."""
    from calispec_tools.stack import StackConfig

    draft, target = args.model_dirs
    return StackConfig(
        draft_model=draft, target_model=target, memory_db=tmp / "memory.db", log_dir=tmp / "logs",
        coordinator_port=0, target_port=0, draft_port=0, memory_port=0, dtype=args.dtype, device=args.device,
        draft_dtype=draft_dtype, draft_threads=args.draft_threads,
        target_threads=args.target_threads, compute_lock=not args.no_compute_lock,
        int8_outliers=args.int8_outliers,
    )  # fmt: skip


def run_calibration_bench(args: argparse.Namespace) -> int:
    from calispec_tools.bench.compare import cpu_flags, isa_caps
    from calispec_tools.cli import served_draft_dtype
    from calispec_tools.stack import service_threads, threads_label

    prompts = benchmark_prompts(args.prompts)
    texts = [] if args.no_text else text_documents()
    draft_dtype = served_draft_dtype(args)
    shares = split_rounds(prompts, args.rounds)
    with tempfile.TemporaryDirectory(prefix="calispec-bench-calibration-") as tmp:
        config = _stack_config(args, Path(tmp), draft_dtype)
        threads = service_threads(config)
        run = _measured_rounds(args, config, draft_dtype, shares, texts)
    methods = [combined(parts[0].label, parts) for parts in zip(*run.rounds, strict=True)]
    sd = methods[0]
    methods[0] = Method(sd.label, sd.events, sd.positions, sd.seconds, run.sd_pairs)
    import torch

    env = {
        "cpu_flags": cpu_flags(), "isa_caps": isa_caps(), "torch": torch.__version__, "device": args.device,
        "dtype": args.dtype,
        "draft_dtype": draft_dtype, "stack_threads": [threads_label(t) for t in threads],
        "process_threads": torch.get_num_threads(),
        "prompts": len(prompts), "rounds": run.note, "max_new_tokens": args.max_new_tokens, "gamma": args.gamma,
        "batch_size": args.batch_size, "int8_outliers": args.int8_outliers or "split (the services' default)",
        "int8_scales": args.int8_scales,
        "teacher_target_linear": run.target_linear,
    }  # fmt: skip
    print(format_report(env, methods, run.rounds))
    return 0


@dataclass(frozen=True)
class Rounds:
    rounds: list[list[Method]]  # each round's methods, SD first
    sd_pairs: Counter[tuple[int, int]]  # the SD run's pairs, read back from the stack's memory
    note: str  # the report's words for the rounds (interleaved, or why not)
    target_linear: str  # the teacher-forced target's Linear path (packed, onednn, default; - on CUDA)


def _measured_rounds(
    args: argparse.Namespace, config: StackConfig, draft_dtype: str, shares: list[list[str]], texts: list[Document]
) -> Rounds:
    """The rounds, interleaved where the pair fits beside the stack, else SD's rounds first and teacher forcing
    after them, the stack stopped."""
    from calispec.client import CalispecClient
    from calispec_tools.stack import LocalStack

    warm = shares[0][0]
    with LocalStack(config) as stack, CalispecClient(stack.coordinator_address, timeout=900,
                                                     **own_stack_auth()) as client:  # fmt: skip
        stack_sd = StackSd(stack, client, args.gamma, args.max_new_tokens, warm, sum(map(len, shares)))
        interleave, note = interleaving(len(shares), *teacher_memory(args))
        if interleave:
            teacher = TeacherForced(args, draft_dtype, warm)  # loaded beside the idle stack
            rounds = [_round(i, shares, stack_sd, teacher, texts) for i in range(len(shares))]
            return Rounds(rounds, stack_sd.pairs(), note, teacher.target_linear)
        sd_runs = [stack_sd.run(share) for share in shares]
        sd_pairs = stack_sd.pairs()
    print("teacher-forced in this process (the stack is stopped)...", file=sys.stderr)
    teacher = TeacherForced(args, draft_dtype, warm)
    text = [teacher.text(texts)] if texts else []
    prompts = [p for share in shares for p in share]
    rounds = [[combined(sd_runs[0].label, sd_runs), teacher.generate(prompts), *text]]
    return Rounds(rounds, sd_pairs, note, teacher.target_linear)

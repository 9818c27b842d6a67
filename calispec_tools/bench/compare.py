"""`calispec bench compare`: the stack against Hugging Face assisted generation, on one machine, in one run.

Per prompt, interleaved (so drift on a shared machine hits every variant alike), greedy, one dtype:

- the stack's `ar`, `sd`, `csd` (four services on loopback; adaptive γ unless --gamma);
- HF transformers in this process on the same pair: `generate()` alone, `generate(assistant_model=draft)`
  with the library's defaults, and tuned to a constant γ (`num_assistant_tokens_schedule="constant"`,
  `num_assistant_tokens=6`, `assistant_confidence_threshold=0`).

Then throughput (tokens/s over all requests) at a few concurrency levels for `ar`, `sd`, `csd`.
Tokens/s is emitted tokens over wall time, prefill included, as a caller sees it. The stack's
services sit idle while HF runs and the other way round.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calispec_core.limits import DEFAULT_LOCKSTEP_PHASE, DEFAULT_RIDE_PREFILL_TOKENS
from calispec_tools.bench.report import cell, jsonable
from calispec_tools.bench.rpc_floor import format_floors, model_service_floors
from calispec_tools.cli_auth import own_stack_auth

if TYPE_CHECKING:
    from calispec_tools.stack import StackConfig

STACK_MODES = ("ar", "sd", "csd")
MODEL_SERVICES = ("draft", "target")
HF_VARIANTS = ("hf_generate", "hf_assisted_default", "hf_assisted_gamma6")
CPU_FLAGS = ("avx512_bf16", "amx_bf16", "avx512_vnni", "avx512f", "avx2")
# Kernel libraries' instruction-set caps: all four set to AVX2 make this CPU's kernels those of an
# AVX2-only CPU (docs/performance.md, "Emulating a CPU without bf16 units"); printed beside the flags.
ISA_CAP_VARS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "FBGEMM_ENABLE_INSTRUCTIONS", "MKL_ENABLE_INSTRUCTIONS")


@dataclass
class Run:
    """One variant on one prompt."""

    variant: str
    prompt: int
    tokens: int
    seconds: float
    token_ids: list[int]
    stats: dict[str, float] = field(default_factory=dict)  # the stack's GenerationStats; empty for HF


@dataclass(frozen=True)
class CompareConfig:
    prompts: list[str]
    max_new_tokens: int
    gamma: int | None  # None: the stack's adaptive γ
    concurrency: list[int]
    load_requests: int  # per concurrency level and mode (0: twice the level)
    skip_hf: bool = False
    load_repeats: int = 1  # runs of each level per mode, the modes alternating


def cpu_flags() -> list[str]:
    from calispec_core.modeling import cpu_flags_text

    words = set(cpu_flags_text().split())
    return [f for f in CPU_FLAGS if f in words]


def isa_caps() -> str:
    """The instruction-set caps in force ("none" without any) and the vector ISA torch's own kernels use."""
    import torch

    caps = [f"{name}={os.environ[name]}" for name in ISA_CAP_VARS if os.environ.get(name)]
    return f"{' '.join(caps) or 'none'} (aten {torch.backends.cpu.get_cpu_capability()})"


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (its vendor decides MKL's float32 kernels)."""
    from calispec_core.modeling import cpu_flags_text

    lines = cpu_flags_text().splitlines()
    names = [line.partition(":")[2].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def gpu_model(device: str) -> str:
    """The GPU a run used ("-" on CPU), printed beside the CPU's name."""
    import torch

    from calispec_core.modeling import resolve_device

    resolved = resolve_device(device)
    return torch.cuda.get_device_name(resolved) if resolved.type == "cuda" else "-"


# --- the stack ------------------------------------------------------------------------------------


def stack_run(client: Any, variant: str, index: int, prompt: str, config: CompareConfig) -> Run:
    start = time.perf_counter()
    result = client.generate(
        prompt, max_new_tokens=config.max_new_tokens, mode=variant, num_speculative_tokens=config.gamma, timeout=900
    )
    seconds = time.perf_counter() - start
    return Run(variant, index, len(result.token_ids), seconds, list(result.token_ids), result.stats.to_dict())


def load_level(address: str, mode: str, concurrency: int, config: CompareConfig) -> dict[str, float]:
    """`requests` requests over `concurrency` client threads, streamed; tokens/s over the level's wall
    time, and over the part of it when all `concurrency` clients had a request in flight."""
    from calispec.client import CalispecClient

    requests = config.load_requests or 2 * concurrency
    prompts = [config.prompts[i % len(config.prompts)] for i in range(requests)]
    with CalispecClient(address, timeout=900, **own_stack_auth()) as client:  # the stack run_compare started
        start = time.perf_counter()

        def one(prompt: str) -> StreamedRequest:
            kwargs = {"mode": mode, "max_new_tokens": config.max_new_tokens}
            record = StreamedRequest()
            for chunk in client.generate_stream(prompt, num_speculative_tokens=config.gamma, timeout=900, **kwargs):
                record.chunks.append((time.perf_counter() - start, len(chunk.token_ids)))
                record.stats = chunk.stats or record.stats
            return record

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            results = list(pool.map(one, prompts))
        seconds = time.perf_counter() - start
    tokens = sum(r.tokens for r in results)
    stats = [r.stats for r in results if r.stats is not None]
    drafted = sum(s.drafted for s in stats)
    full_s, full_tokens = full_concurrency_window(results, concurrency)
    return {
        "requests": requests, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
        "full_concurrency_s": full_s, "full_concurrency_tokens_per_s": full_tokens / full_s if full_s else float("nan"),
        "acceptance": sum(s.accepted for s in stats) / drafted if drafted else float("nan"),
        "max_batch": max((s.max_batch_size for s in stats), default=0),
    }  # fmt: skip


THROUGHPUTS = ("tokens_per_s", "full_concurrency_tokens_per_s")


def run_load(address: str, config: CompareConfig) -> dict[str, dict[int, dict[str, Any]]]:
    """Each level `load_repeats` times, the modes alternating within each repeat (so each repeat's modes
    meet about the same machine: a shared host's speed drifts by 10-20 % between minutes), and each repeat
    starting with the next mode (`rotated`)."""
    runs: dict[str, dict[int, list[dict[str, float]]]] = defaultdict(lambda: defaultdict(list))
    for level in config.concurrency:
        for repeat in range(config.load_repeats):
            for mode in rotated(STACK_MODES, repeat):
                result = load_level(address, mode, level, config)
                runs[mode][level].append(result)
                print(f"  load {mode} c={level} run {repeat + 1}: {result['tokens_per_s']:.2f} tok/s", file=sys.stderr)
    return {
        mode: {level: combine_repeats(rows, runs["ar"][level]) for level, rows in per.items()}
        for mode, per in runs.items()
    }


def combine_repeats(mine: list[dict[str, float]], ar: list[dict[str, float]]) -> dict[str, Any]:
    """One level of one mode over its repeats: medians, each throughput's runs, and the median of its
    ratios to `ar`'s run of the same repeat (paired, so drift between repeats cancels)."""
    # the largest target batch is the largest of all repeats, as its label says; the rest medians
    combined: dict[str, Any] = {
        k: (max if k == "max_batch" else statistics.median)(r[k] for r in mine) for k in mine[0]
    }
    for key in THROUGHPUTS:
        combined[f"{key}_runs"] = [r[key] for r in mine]
        combined[f"{key}_x_ar"] = statistics.median(m[key] / a[key] for m, a in zip(mine, ar, strict=True))
    return combined


@dataclass
class StreamedRequest:
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (seconds since the level started, tokens)
    stats: Any = None  # GenerationStats, from the last chunk

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.chunks)

    @property
    def end_s(self) -> float:
        return self.chunks[-1][0] if self.chunks else 0.0


def full_concurrency_window(results: Sequence[StreamedRequest], concurrency: int) -> tuple[float, int]:
    """(seconds, tokens) from the level's start until the first client ran out of requests: the closed
    loop keeps `concurrency` requests in flight until its (requests - concurrency + 1)-th completion.
    After it the level drains with fewer requests, and how long that lasts depends on how unevenly the
    last requests progress, not on the throughput at this concurrency. Fewer requests than clients never had
    `concurrency` in flight: (0, 0), no figure."""
    if len(results) < concurrency:
        return 0.0, 0
    ends = sorted(r.end_s for r in results)
    until = ends[len(ends) - concurrency]
    return until, sum(n for r in results for t, n in r.chunks if t <= until)


# --- Hugging Face in process ----------------------------------------------------------------------


class HfPair:
    """The pair loaded with transformers, as a user of `generate(assistant_model=...)` would, in the dtypes the
    stack serves: an int8 model (the stack's CPU draft by default) gets the same dynamic quantisation the
    model services apply (`quantize_int8`), so both sides run the same weights. The Linear path stays HF's
    (torch's own); the stack's oneDNN path, lean pass, pruned draft head and first-token outlier rows quantised
    apart (calispec_core/int8_outliers.py: torch's int8 layers keep one scale a call) are its own engineering."""

    def __init__(self, draft: Path, target: Path, dtype: str, device: str, draft_dtype: str | None = None) -> None:
        import torch
        from transformers import AutoTokenizer

        from calispec_core.modeling import resolve_device

        self.torch = torch
        self.device = resolve_device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(target), local_files_only=True)
        self.target = self._load(target, dtype)
        self.draft = self._load(draft, draft_dtype or dtype)
        config = self.draft.generation_config
        self.assistant_defaults = {
            name: getattr(config, name, None)
            for name in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
        }

    def _load(self, path: Path, dtype: str) -> Any:
        """One model in `dtype` as the model services load it (`auto` resolved, int8 quantised dynamically)."""
        from transformers import AutoModelForCausalLM

        from calispec_core.modeling import INT8, quantize_int8, resolve_dtype

        torch_dtype = resolve_dtype(dtype, self.device)  # int8: float32 weights, quantised below
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, local_files_only=True)
        model = model.to(self.device).eval()
        return quantize_int8(model) if dtype == INT8 else model

    def _assistant(self, variant: str) -> Any:
        """The draft configured for the variant (HF's heuristic schedule mutates it: reset every call)."""
        if variant == "hf_generate":
            return None
        config = self.draft.generation_config
        for name, value in self.assistant_defaults.items():
            setattr(config, name, value)
        if variant == "hf_assisted_gamma6":
            config.num_assistant_tokens_schedule = "constant"
            config.num_assistant_tokens = 6
            config.assistant_confidence_threshold = 0.0
        return self.draft

    def run(self, variant: str, index: int, prompt: str, max_new_tokens: int) -> Run:
        torch = self.torch
        encoded = self.tokenizer(prompt, return_tensors="pt").to(self.device)
        assistant = self._assistant(variant)
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.target.generate(
                **encoded,
                assistant_model=assistant,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.eos_token_id,
            )
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        new = out[0, encoded["input_ids"].shape[1] :].tolist()
        return Run(variant, index, len(new), seconds, new)


# --- the run --------------------------------------------------------------------------------------


def rotated(items: Sequence[str], shift: int) -> list[str]:
    """`items` starting at position `shift` (mod their number), then wrapping around. Interleaved runs take
    turns going first: the machine drifts within a prompt's runs too (a later mode in a fixed order met a
    slower machine on every prompt of one run: 10-15 % on both models' forwards, scratch, wave 11)."""
    shift %= len(items)
    return [*items[shift:], *items[:shift]]


def run_interleaved(
    client: Any, hf: HfPair | None, config: CompareConfig, progress: Callable[[Run], None]
) -> list[Run]:

    def run(variant: str, index: int, prompt: str) -> Run:
        if variant in STACK_MODES:
            return stack_run(client, variant, index, prompt, config)
        assert hf is not None  # HF variants are listed only with a loaded pair
        return hf.run(variant, index, prompt, config.max_new_tokens)

    variants = [*STACK_MODES, *(HF_VARIANTS if hf is not None else ())]
    runs = []
    for index, prompt in enumerate(config.prompts):
        for variant in rotated(variants, index):
            runs.append(run(variant, index, prompt))
            progress(runs[-1])
    return runs


def warm_up(client: Any, hf: HfPair | None, prompt: str, tokens: int) -> None:
    """First calls pay one-off costs (allocations, kernel selection): not measured."""
    for mode in STACK_MODES:
        client.generate(prompt, max_new_tokens=tokens, mode=mode, timeout=900)
    for variant in HF_VARIANTS if hf is not None else ():
        hf.run(variant, 0, prompt, tokens)


def warm_up_tokens(device: str, max_new_tokens: int) -> int:
    """On CUDA a whole request's length: kernels load on first use per shape, and on an H200 the first
    96-token request after an 8-token warm-up took 3x the next ones (docs/waves.md wave 27); on CPU 8 suffice."""
    from calispec_core.modeling import resolve_device

    return max_new_tokens if resolve_device(device).type == "cuda" else 8


def summarize(runs: list[Run]) -> dict[str, dict[str, float]]:
    """Per variant: tokens/s over all prompts, and the stack's speculation figures."""
    by_variant: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_variant[r.variant].append(r)
    summary = {}
    for variant, rs in by_variant.items():
        tokens, seconds = sum(r.tokens for r in rs), sum(r.seconds for r in rs)
        row: dict[str, float] = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}
        if rs[0].stats:
            row |= speculation_figures(rs)
        summary[variant] = row
    return summary


def speculation_figures(runs: list[Run]) -> dict[str, float]:
    """Acceptance, tokens per round, chosen γ and the per-round overhead, over the stack's runs."""
    t = {key: sum(r.stats[key] for r in runs) for key in runs[0].stats}
    rounds, drafting_rounds = t["rounds"], t["rounds"] - t["target_only_rounds"]

    def per(num: float, den: float) -> float:
        return num / den if den else math.nan  # nothing drafted: no acceptance (printed "-"), not 0 %

    return {
        "acceptance": per(t["accepted"], t["drafted"]),
        "accepted_per_drafting_round": per(t["accepted"], drafting_rounds),
        "tokens_per_round": per(t["emitted"], rounds),
        "mean_gamma": per(sum(r.stats["mean_gamma"] * r.stats["rounds"] for r in runs), rounds),
        "target_only_share": per(t["target_only_rounds"], rounds),
        "overhead_share": per(t["round_overhead_ms"], t["total_ms"]),
        "overhead_ms_per_round": per(t["round_overhead_ms"], rounds),
    }


def ratios(summary: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Every variant's tokens/s over `ar`'s and over the better assisted-generation variant's."""
    tps = {v: row["tokens_per_s"] for v, row in summary.items()}
    assisted = max((tps[v] for v in ("hf_assisted_default", "hf_assisted_gamma6") if v in tps), default=None)
    out = {}
    for variant, value in tps.items():
        out[variant] = {"vs_ar": value / tps["ar"]}
        if assisted:
            out[variant]["vs_best_assisted"] = value / assisted
    return out


def agreement(runs: list[Run]) -> dict[str, int]:
    """Greedy outputs identical to the stack's `ar` (float32 must be; bf16 may differ at near-ties)."""
    ar = {r.prompt: r.token_ids for r in runs if r.variant == "ar"}
    counts: dict[str, int] = defaultdict(int)
    for r in runs:
        if r.variant != "ar":
            counts[r.variant] += r.token_ids == ar[r.prompt]
    return dict(counts)


# --- printing -------------------------------------------------------------------------------------


def memory_left(available: int | None) -> tuple[str, str | None]:
    """The report's words for the memory left once every model is loaded, and a warning where it is short: the
    page cache (the libraries' code, the stack's files) is evicted and every figure is inflated."""
    from calispec_core.host_memory import GIB, LOW_MEMORY

    if available is None:
        return "unknown", None
    left = f"{available / GIB:.1f} GiB"
    if available >= LOW_MEMORY:
        return left, None
    return left + " (short)", (f"warning: only {left} of memory left with every model loaded: the figures may be "
                               "inflated (--skip-hf leaves Hugging Face's pair out; a float32 target on packed "
                               "weights holds them twice: --fp32-linear onednn)")  # fmt: skip


def environment(args: argparse.Namespace, draft_dtype: str, threads: tuple[int | None, int | None]) -> dict[str, Any]:
    import torch

    from calispec_core.batch_scheduler import DEFAULT_GATHER_S
    from calispec_core.modeling import resolve_device, serving_dtype_name
    from calispec_tools.bench.pair import PROMPTS
    from calispec_tools.stack import threads_label

    return {
        "cpu_flags": cpu_flags(),
        "isa_caps": isa_caps(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "gpu": gpu_model(args.device),
        "torch": torch.__version__,
        "device": args.device,
        "dtype": f"{args.dtype} ({serving_dtype_name(args.dtype, resolve_device(args.device))})",
        "draft_dtype": draft_dtype,  # HF's assistant too (HfPair)
        "fp32_linear": args.fp32_linear or "auto",  # the stack's, as asked (run_compare adds what it resolved to)
        "draft_threads": threads_label(threads[0]),
        "target_threads": threads_label(threads[1]),
        "hf_threads": torch.get_num_threads(),
        "gamma": args.gamma if args.gamma else "adaptive",
        "batch_gather_ms": DEFAULT_GATHER_S * 1000 if args.batch_gather_ms is None else args.batch_gather_ms,
        "max_new_tokens": args.max_new_tokens,
        "prompts": len(args.prompt_texts),
        "kinds": "+".join(k for k in PROMPTS if k in (getattr(args, "kinds", None) or PROMPTS)),  # as they ran
    }


def format_report(
    env: dict[str, Any],
    summary: dict[str, Any],
    rel: dict[str, Any],
    load: dict[str, Any],
    floors: dict[str, dict[str, float]] | None = None,
) -> str:
    lines = ["environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), ""]
    lines.append(f"{'variant':20s} {'tok/s':>7s} {'× ar':>6s} {'× assist':>8s} {'accept':>7s} {'acc/rnd':>7s} "
                 f"{'tok/rnd':>7s} {'mean γ':>6s} {'γ=0':>5s} {'ovh %':>6s} {'ovh ms':>6s}")  # fmt: skip
    for variant in (*STACK_MODES, *HF_VARIANTS):
        if variant not in summary:
            continue
        row, r = summary[variant], rel[variant]
        vs_assisted = r.get("vs_best_assisted", math.nan)
        cells = f"{variant:20s} {row['tokens_per_s']:7.2f} {r['vs_ar']:6.2f} {_cell(vs_assisted, 8, '.2f')}"
        if "acceptance" in row:
            cells += (
                f" {_cell(row['acceptance'], 7, '.1%')} {_cell(row['accepted_per_drafting_round'], 7, '.2f')}"
                f" {row['tokens_per_round']:7.2f} {row['mean_gamma']:6.2f} {row['target_only_share']:5.0%}"
                f" {row['overhead_share']:6.1%} {row['overhead_ms_per_round']:6.2f}"
            )
        lines.append(cells)
    lines.append("ovh: round time outside the two models' forwards as the services timed them (RPCs, sampling,")
    lines.append("     verification, hand-offs, bookkeeping); % of request time, ms per round")
    if floors:  # a round makes one round trip to each model service, after a forward
        lines.append("     " + format_floors(floors) + " (GetModelInfo)")
    lines.append("mean γ: asked of the draft (alone, a request asks up to max_gamma; its path floor stops it sooner)")
    lines.append("acc/rnd: accepted draft tokens per round that drafted (γ > 0; `calispec eval`'s: per round)")
    if load:
        levels = sorted({c for per_mode in load.values() for c in per_mode})
        lines += ["", "throughput (tokens/s over all requests) by concurrency:"]
        lines += _throughput_table(load, levels, "tokens_per_s")
        if all("full_concurrency_tokens_per_s" in row for per_mode in load.values() for row in per_mode.values()):
            lines.append("throughput while every client had a request in flight (until the first ran out):")
            lines += _throughput_table(load, levels, "full_concurrency_tokens_per_s")
        repeated = [(m, c, row["tokens_per_s_runs"]) for m, per in load.items() for c, row in per.items()
                    if len(row.get("tokens_per_s_runs", [])) > 1]  # fmt: skip
        if repeated:
            lines.append("repeats (medians above; × ar: the median of each repeat's ratio), tokens/s per run:")
            lines += [f"{m:6s} c={c}: " + " ".join(f"{v:.2f}" for v in runs) for m, c, runs in repeated]
        lines.append("acceptance | largest target batch seen, by concurrency:")
        for mode, per_level in load.items():
            cells = [f"{_cell(per_level[c].get('acceptance', math.nan), 0, '.1%')} | {per_level[c].get('max_batch', 0)}"
                     for c in levels]  # fmt: skip
            lines.append(f"{mode:6s} " + "  ".join(f"{c:>14s}" for c in cells))
    return "\n".join(lines)


def _ratio_to_ar(load: dict[str, dict[int, dict[str, Any]]], mode: str, level: int, key: str) -> float:
    """The paired median ratio when the level was repeated, else the plain ratio."""
    row = load[mode][level]
    if f"{key}_x_ar" in row:
        return row[f"{key}_x_ar"]
    return row[key] / load["ar"][level][key] if "ar" in load else float("nan")


def _throughput_table(load: dict[str, dict[int, dict[str, Any]]], levels: list[int], key: str) -> list[str]:
    lines = [f"{'mode':6s} " + " ".join(f"{'c=' + str(c):>9s}" for c in levels) + "   × ar"]
    for mode, per_level in load.items():
        values = [per_level[c][key] for c in levels]
        ratio = [_ratio_to_ar(load, mode, c, key) for c in levels]
        lines.append(
            f"{mode:6s} "
            + " ".join(_cell(v, 9, ".2f") for v in values)
            + "   "
            + " ".join(_cell(x, 0, ".2f") for x in ratio)
        )
    return lines


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Strict JSON (NaN as null: `ar`'s acceptance has none; json.dumps wrote NaN, which JSON parsers refuse)."""
    path.write_text(json.dumps(jsonable(doc), indent=1, allow_nan=False) + "\n")


def _cell(value: float, width: int, spec: str) -> str:
    """`report.cell` right-aligned in `width` (NaN: nothing drafted, no HF run, no full-concurrency window)."""
    return f"{cell(value, spec):>{width}}"


# --- entry ----------------------------------------------------------------------------------------


def compare_stack_config(args: argparse.Namespace, tmp: Path) -> StackConfig:
    """The stack `calispec up` would serve with these flags (the pair's shipped calibration seeded, unless
    --no-calibration or explicit --draft/--target), on free ports, its memory and logs under `tmp`."""
    from calispec_tools.cli import calibration_lambdas, draft_vocab, seeded_calibration, served_draft_dtype
    from calispec_tools.stack import StackConfig

    draft, target = args.model_dirs
    return StackConfig(
        draft_model=draft, target_model=target, memory_db=tmp / "memory.db", log_dir=tmp / "logs",
        coordinator_port=0, target_port=0, draft_port=0, memory_port=0, dtype=args.dtype, device=args.device,
        draft_dtype=served_draft_dtype(args), draft_threads=args.draft_threads, target_threads=args.target_threads,
        draft_vocab=draft_vocab(args, None if args.draft else args.pair), batch_gather_ms=args.batch_gather_ms,
        prefix_cache_tokens=args.prefix_cache_tokens, ride_prefill_tokens=args.ride_prefill_tokens,
        fp32_linear=args.fp32_linear, int8_outliers=args.int8_outliers,
        compute_lock=not args.no_compute_lock, meaning_guard=args.meaning_guard,
        lockstep_phase=args.lockstep_phase,
        calibration_file=seeded_calibration(args), calibration_lambdas=calibration_lambdas(args),
    )  # fmt: skip


def run_compare(args: argparse.Namespace) -> int:
    from calispec.client import CalispecClient
    from calispec_core.host_memory import available_bytes
    from calispec_tools.stack import LocalStack, compute_lock_path, service_threads

    draft, target = args.model_dirs
    config = CompareConfig(
        args.prompt_texts,
        args.max_new_tokens,
        args.gamma,
        args.concurrency,
        args.load_requests,
        args.skip_hf,
        args.load_repeats,
    )
    with tempfile.TemporaryDirectory(prefix="calispec-compare-") as tmp:
        stack_config = compare_stack_config(args, Path(tmp))
        draft_dtype, draft_vocab = stack_config.draft_dtype, stack_config.draft_vocab
        threads = service_threads(stack_config)
        # HF first: the services' `--fp32-linear auto` packs only where the memory left holds the copy, and a
        # peer loaded after them took that memory (the packed float32 target was OOM-killed on 24 GB, wave 14)
        hf = None if config.skip_hf else HfPair(draft, target, args.dtype, args.device, draft_dtype)
        print(f"starting the stack (draft {draft} in {draft_dtype}, draft vocab {draft_vocab or 'full'}, "
              f"target {target})...", file=sys.stderr)  # fmt: skip
        with (
            LocalStack(stack_config) as stack,
            CalispecClient(stack.coordinator_address, timeout=900, **own_stack_auth()) as client,
        ):
            linear = {name: stack.services[f"{name}_service"].banner_value("fp32_linear") for name in MODEL_SERVICES}
            seeded = stack.calibration  # what csd starts from, as `up` reports it (a refused file is no calibration)
            calibration = seeded.message if seeded else "none (--no-calibration, or no shipped file for this pair)"
            csd_defaults = stack.csd_defaults_message()
            print(f"{calibration}\n{csd_defaults}", file=sys.stderr)
            warm_up(client, hf, config.prompts[0], warm_up_tokens(args.device, config.max_new_tokens))
            memory, memory_warning = memory_left(available_bytes())  # every model loaded, caches warm
            if memory_warning:
                print(memory_warning, file=sys.stderr)
            floors = model_service_floors(*(stack.services[f"{name}_service"].address for name in MODEL_SERVICES))

            def progress(run: Run) -> None:
                print(f"  prompt {run.prompt} {run.variant:20s} {run.tokens:4d} tokens {run.seconds:7.2f} s "
                      f"({run.tokens / run.seconds:6.2f} tok/s)", file=sys.stderr)  # fmt: skip

            runs = run_interleaved(client, hf, config, progress)
            del hf  # free its memory before the load test
            load = run_load(stack.coordinator_address, config)
    env = environment(args, draft_dtype, threads) | {
        "draft_vocab": draft_vocab or "full",
        "prefix_cache_tokens": args.prefix_cache_tokens,
        "ride_prefill_tokens": (  # prompts up to this long prefill in their session's first batched forward
            args.ride_prefill_tokens
            if args.ride_prefill_tokens is not None
            else f"{DEFAULT_RIDE_PREFILL_TOKENS} (the services' default)"
        ),
        "fp32_linear": f"{args.fp32_linear or 'auto'} (target {linear['target']}, draft {linear['draft']})",
        "int8_outliers": args.int8_outliers or "split (the services' default)",  # int8_outliers.py
        "compute_lock": "on" if compute_lock_path(stack_config) else "off",  # forwards take turns (host_lock.py)
        "calibration": calibration,  # the memory csd starts from (shipped_calibration.py), as `up` seeds it
        "meaning_guard": "on" if stack_config.meaning_guard else "off",
        "lockstep_phase": stack_config.lockstep_phase or f"{DEFAULT_LOCKSTEP_PHASE} (the coordinator's default)",
        "csd_defaults": csd_defaults.removeprefix("CSD defaults: "),  # the τ and λ csd ran at, and why
        "memory_left": memory,  # MemAvailable (or a cgroup's headroom) once every model is loaded and warm
    }
    summary = summarize(runs)
    rel = ratios(summary)
    print(format_report(env, summary, rel, load, floors))
    if memory_warning:
        print(memory_warning)
    same = agreement(runs)
    print(
        "greedy outputs identical to the stack's ar: "
        + ", ".join(f"{v} {n}/{len(config.prompts)}" for v, n in same.items())
    )
    if args.json:
        doc = {"environment": env, "summary": summary, "ratios": rel, "load": load, "agreement": same,
               "rpc_floor_ms": floors, "runs": [asdict(r) for r in runs]}  # fmt: skip
        write_json(Path(args.json), doc)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0

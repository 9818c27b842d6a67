"""`calispec calibrate`: seed the correction memory.

calispec calibrate --corpus FILE|DIR [--generate] [--events dense|sd]   # teacher-forced, batched (fast)
calispec calibrate --corpus DIR --export FILE                          # to an export file, no stack needed
calispec calibrate --corpus DIR --ray ADDRESS --workers N               # the same as a Ray job
calispec calibrate --prompts FILE                                       # standard SD through the stack (slow)

The memory service, namespace, model pair and writer token default to the running stack's
(`calispec up`); see docs/calibration.md for what each event mode reproduces. A flag the run would
not read (`--batch-size` with `--prompts`, `--gamma` without `--events sd`, ...) is a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calispec_core.limits import (
    DTYPE_CHOICES,
    INT8,
    INT8_OUTLIER_CHOICES,
    INT8_SCALE_CALL,
    INT8_SCALE_CHOICES,
    INT8_SCALE_ROW,
    INT8_SPLIT,
)
from calispec_tools import arg_types as at
from calispec_tools.cli_auth import USAGE_ERROR, usage_error
from calispec_tools.deploy.ray_config import DeploymentError, check_reachable
from calispec_tools.memory_reads import memory_failure

if TYPE_CHECKING:
    from calispec_core.credentials import TlsConfig
    from calispec_tools.stack_state import StackState

DEFAULT_COORDINATOR = "127.0.0.1:50050"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("calibrate", help="seed the correction memory (teacher-forced over a corpus, or SD)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", type=Path, help="JSONL/text file or directory: teacher-forced calibration")
    source.add_argument("--prompts", type=Path, help="one prompt per line, or JSONL: standard SD through the stack")
    p.add_argument("--generate", action="store_true", help="the target first continues every prompt of the corpus")
    p.add_argument("--events", default="dense", choices=["dense", "sd"],
                   help="dense: every draft/target disagreement; sd: exactly a greedy SD run's events (with "
                   "--generate)")  # fmt: skip
    p.add_argument(
        "--gamma",
        type=at.gamma,
        default=6,
        help="speculative tokens per round (sd events; --prompts: fixed, adaptive γ may not draft at all)",
    )
    p.add_argument(
        "--max-new-tokens", type=at.max_new_tokens, default=128, help="--generate / --prompts: tokens per prompt"
    )
    p.add_argument(
        "--max-tokens", type=at.window_tokens, default=512, help="documents are cut into windows of this many tokens"
    )
    p.add_argument("--batch-size", type=at.positive_int, default=8)
    p.add_argument("--pair", default=None, help="model pair (default: the running stack's, else qwen-coder)")
    p.add_argument("--draft", help="draft model dir (with --target)")
    p.add_argument("--target", help="target model dir (with --draft)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument(
        "--draft-dtype", default=None, choices=DTYPE_CHOICES,
        help="the draft's (default: what `calispec up` serves, int8 on CPU): events come from the draft as served",
    )  # fmt: skip
    p.add_argument(
        "--int8-outliers", default=INT8_SPLIT, choices=INT8_OUTLIER_CHOICES,
        help="int8 models' first-token outlier rows: split (as the services compute them) or shared (torch's one "
        "scale a call; the shipped file of waves 26-40 was counted so)",
    )  # fmt: skip
    add_int8_scales_arg(p)
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--namespace",
        type=at.memory_namespace,
        default=None,
        help="default: the running stack's (or the pair's, with --export)",
    )
    p.add_argument(
        "--memory-addr", type=at.address, default=None, help="memory service HOST:PORT (default: the running stack's)"
    )
    p.add_argument("--writer-token-file", type=Path, default=None, help="default: the running stack's")
    p.add_argument("--export", type=Path, default=None, help="write an export file instead of the memory service")
    p.add_argument(
        "--min-count", type=at.positive_int, default=1, help="--export: keep pairs counted at least this often"
    )
    p.add_argument("--ray", metavar="ADDRESS", default=None, help="run as a Ray job on this cluster")
    p.add_argument("--workers", type=at.positive_int, default=2, help="--ray: worker actors (each loads the pair)")
    p.add_argument("--worker-cpus", type=at.positive_float, default=1.0, help="--ray: CPUs per worker")
    p.add_argument(
        "--worker-gpus", type=at.non_negative_float, default=None,
        help="--ray: GPUs per worker, fractions share one (default: 1 with --device cuda, else 0; Ray hides every "
        "GPU from a worker that asks for none)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument(
        "--address", type=at.address, default=None,
        help=f"--prompts: coordinator HOST:PORT (default: the running `calispec up`'s, else {DEFAULT_COORDINATOR})",
    )  # fmt: skip
    p.add_argument("--timeout", type=at.positive_float, default=300.0, help="--prompts: per request, seconds")
    from calispec_tools.cli_auth import add_client_auth_args
    from calispec_tools.cli_memory import add_memory_tls_args

    add_client_auth_args(p)  # --prompts: the coordinator's API key / TLS
    add_memory_tls_args(p)  # the memory service under mutual TLS (a verifier's certificate to write)
    p.set_defaults(func=cmd_calibrate, calibrate_defaults={dest: p.get_default(dest) for dest in READ_WITH})


# What reads each flag that not every run reads: given away from its default where nothing reads it, the
# run would ignore it without a word (`--prompts --batch-size 32` ran SD through the stack as if not given).
CORPUS_ONLY = (
    "generate", "events", "max_tokens", "batch_size", "pair", "draft", "target", "dtype", "draft_dtype",
    "int8_outliers", "int8_scales", "device", "export", "ray", "json",
)  # fmt: skip
READ_WITH = {
    **dict.fromkeys(CORPUS_ONLY, "--corpus"),
    "gamma": "--events sd or --prompts",
    "max_new_tokens": "--generate or --prompts",
    "min_count": "--export",
    "writer_token_file": "--corpus without --export",
    "memory_addr": "--prompts or --corpus without --export",
    "workers": "--ray",
    "worker_cpus": "--ray",
    "worker_gpus": "--ray",
    **dict.fromkeys(("address", "timeout", "token", "tls_ca", "tls_server_name"), "--prompts"),
}


def _read_here(args: argparse.Namespace) -> dict[str, bool]:
    """Which of READ_WITH's conditions this run meets."""
    corpus, export = args.corpus is not None, args.export is not None
    return {
        "--corpus": corpus,
        "--prompts": not corpus,
        "--events sd or --prompts": not corpus or args.events == "sd",
        "--generate or --prompts": not corpus or args.generate,
        "--export": corpus and export,
        "--corpus without --export": corpus and not export,
        "--prompts or --corpus without --export": not export,
        "--ray": corpus and args.ray is not None,
    }


def worker_gpus(args: argparse.Namespace) -> float:
    """GPUs a Ray worker asks for: Ray sets CUDA_VISIBLE_DEVICES="" for an actor that asks for none, so
    `--device cuda` failed in every worker and `--device auto` ran them on CPU (found by a CUDA audit)."""
    if args.worker_gpus is not None:
        return args.worker_gpus
    return 1.0 if args.device.startswith("cuda") else 0.0


def unread_flags_problem(args: argparse.Namespace) -> str | None:
    """The flags given (away from their defaults) that this run would not read, as one usage error, or None."""
    defaults, read_here = args.calibrate_defaults, _read_here(args)
    unread = [
        f"--{dest.replace('_', '-')} (read with {condition} only)"
        for dest, condition in READ_WITH.items()
        if not read_here[condition] and getattr(args, dest) != defaults[dest]
    ]
    return f"this run would ignore {', '.join(unread)}" if unread else None


def add_int8_scales_arg(p: argparse.ArgumentParser) -> None:
    """`--int8-scales`, for `calispec calibrate` and `calispec bench calibration`."""
    p.add_argument(
        "--int8-scales", default=INT8_SCALE_CALL, choices=INT8_SCALE_CHOICES,
        help="an int8 draft's activation scales in teacher-forced calls: call (one a call, outlier rows apart; the "
        "shipped file was counted so) or row (each row its own, as the draft's one-token serving steps quantise: "
        "closer to serving's predictions, a slower draft pass; needs an int8 draft and --int8-outliers split)",
    )  # fmt: skip


def int8_scales_problem(args: argparse.Namespace) -> str | None:
    """Why --int8-scales cannot be honoured with the other flags, or None."""
    if args.int8_scales != INT8_SCALE_ROW:
        return None
    if (args.int8_outliers or INT8_SPLIT) != INT8_SPLIT:
        return "--int8-scales row needs --int8-outliers split (the layers that quantise rows apart)"
    from calispec_tools.cli import served_draft_dtype

    if (draft_dtype := served_draft_dtype(args)) != INT8:
        served = "auto (a float dtype)" if draft_dtype == "auto" else draft_dtype  # int8 runs on CPU only
        return f"--int8-scales row is for an int8 draft; this one runs in {served}, which has no activation scales"
    return None


def _fail(message: str, status: int = 1) -> int:
    print(f"error: {message}", file=sys.stderr)
    return status


def ray_device_problem(args: argparse.Namespace) -> str | None:
    """A worker sees only the GPUs Ray gave it, numbered from 0: `cuda:1` names none there (found by review)."""
    device = args.device
    if args.ray and device.startswith("cuda:") and device != "cuda:0":
        return f"--device {device} with --ray: each worker sees only its own GPUs, from 0; give --device cuda"
    return None


def cmd_calibrate(args: argparse.Namespace) -> int:
    if problem := unread_flags_problem(args) or ray_device_problem(args):
        return _fail(problem, USAGE_ERROR)
    return calibrate_corpus(args) if args.corpus else calibrate_by_sd(args)


# -- teacher-forced -------------------------------------------------------------------------------


def the_stacks_pair(args: argparse.Namespace) -> StackState | None:
    """The running stack when the pair calibrated is the one it serves (no --draft/--target, no --pair), else None."""
    from calispec_tools.stack_state import running_stack

    return None if args.draft or args.pair is not None else running_stack()


def model_dirs(args: argparse.Namespace) -> tuple[Path, Path]:
    """--draft/--target, else --pair, else the running stack's pair, else qwen-coder."""
    from calispec_tools.cli import ensure_pulled_pair, ensure_tiny_pair

    if bool(args.draft) != bool(args.target):
        raise SystemExit(usage_error("give both --draft and --target, or neither"))
    if args.draft:
        return Path(args.draft), Path(args.target)
    if (stack := the_stacks_pair(args)) is not None:
        return Path(stack.draft), Path(stack.target)
    if args.pair == "tiny":
        target, draft = ensure_tiny_pair()
        return draft, target
    return ensure_pulled_pair(args.pair or "qwen-coder")


def missing_model_dir(*dirs: Path) -> str | None:
    """The first of the pair's directories that is not one, or None: named before anything loads (a stale
    stack's pair, a mistyped --draft), not as a traceback from the model loader."""
    for path in dirs:
        if not path.is_dir():
            return f"model directory not found: {path}"
    return None


def calibrate_corpus(args: argparse.Namespace) -> int:
    from calispec_tools.calibrate.corpus import load_corpus
    from calispec_tools.calibrate.job import CalibrateConfig

    if args.ray and args.export is not None:
        return _fail("--export writes the counts from this process, --ray's workers through the memory service: "
                     "give one", USAGE_ERROR)  # fmt: skip
    if args.export is not None and (problem := export_path_problem(args.export)):
        return _fail(problem, USAGE_ERROR)
    take_the_stacks_settings(args)
    if problem := int8_scales_problem(args) or ray_device_problem(args):  # the device may be the stack's now
        return _fail(problem, USAGE_ERROR)
    config = CalibrateConfig(
        mode=args.events, generate=args.generate, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
        max_tokens=args.max_tokens, batch_size=args.batch_size, int8_scales=args.int8_scales,
    )  # fmt: skip
    try:
        config.validate()
        docs = load_corpus(args.corpus)
    except (OSError, ValueError) as exc:
        return _fail(f"cannot calibrate: {exc}")
    if args.events == "sd" and not args.generate:
        print("warning: --events sd reproduces SD exactly only on the target's own text (--generate)", file=sys.stderr)
    draft, target = model_dirs(args)
    if not args.ray and (problem := missing_model_dir(draft, target)):  # --ray: the workers' paths
        return _fail(problem, USAGE_ERROR)
    if args.export is not None:
        return _to_export(args, docs, config, draft, target)
    address, namespace, token, tls = _memory_target(args)
    if not args.ray and (problem := another_pairs_namespace(args, address, draft, target)):  # --ray: workers' paths
        return _fail(problem, USAGE_ERROR)
    if args.ray:
        try:
            check_reachable(args.ray)  # before Ray is imported, and before its retries
        except DeploymentError as exc:
            return _fail(f"cannot calibrate on Ray: {exc}")
        from calispec_tools.calibrate.ray_job import RayJob, WorkerFailed, run_on_ray
        from calispec_tools.cli import served_draft_dtype
        from calispec_tools.pems import pem_texts

        draft_dtype = served_draft_dtype(args)
        job = RayJob(
            draft=str(draft), target=str(target), dtype=args.dtype, device=args.device, memory=address,
            namespace=namespace, token=token, draft_dtype=draft_dtype, int8_outliers=args.int8_outliers,
            tls=pem_texts(tls),
        )  # fmt: skip
        try:
            summary, parts = run_on_ray(args.ray, docs, config, job, args.workers, args.worker_cpus, worker_gpus(args))
        except WorkerFailed as exc:  # a worker's missing model dir, row scales its node cannot give, a lost node
            return _fail(
                f"cannot calibrate on Ray: a worker failed: {exc} (events sent before it stay in namespace "
                f"{namespace}: a rerun into it counts them again)"
            )
        extra = {"workers": [{"documents": p.documents, "events": p.events, "total_s": p.total_s} for p in parts]}
    else:
        summary, extra = _run_local(args, docs, config, draft, target, address, namespace, token, tls), {}
    _print_summary(summary.to_dict() | {"namespace": namespace, **extra}, summary.pairs, args.json)
    return 0


def another_pairs_namespace(args: argparse.Namespace, address: str, draft: Path, target: Path) -> str | None:
    """Why the running stack's namespace, taken by default, is not for this pair's events, or None: another pair
    (same vocabulary) would have its events counted as the stack's (found by probing: exit 0, 112 pairs added)."""
    from calispec_tools.namespaces import pair_namespace
    from calispec_tools.stack_state import running_stack

    stack = running_stack()
    if args.namespace or stack is None or not stack.serves_memory_at(address) or not Path(stack.target).is_dir():
        return None
    mine = pair_namespace(draft, target)
    if pair_namespace(Path(stack.draft), Path(stack.target)) == mine:
        return None
    return (
        f"the running stack serves another pair ({stack.draft}, {stack.target}): its namespace {stack.namespace} is "
        f"not for these models' events; give --namespace (this pair's own: {mine})"
    )


def take_the_stacks_settings(args: argparse.Namespace) -> None:
    """Calibrating the running stack's pair, dtypes and device left at their defaults are the stack's: its events
    are those of the models it serves (a `calispec up --dtype float32 --draft-dtype float32` was calibrated with an
    int8 draft, its events not SD's; found by probing; a `--device cpu` stack on a GPU host was calibrated on the
    GPU, whose kernels round otherwise)."""
    stack = the_stacks_pair(args)
    if stack is None:  # another pair, or the stack's named: the flags as given
        return
    if args.device == "auto":
        args.device = stack.device
    if args.dtype == "auto" and stack.dtype != INT8:  # an int8 target (opt-in) is not teacher-forced: the flags'
        args.dtype = stack.dtype
    if args.draft_dtype is None and stack.draft_dtype != "auto":
        args.draft_dtype = stack.draft_dtype


def export_path_problem(path: Path) -> str | None:
    """Why an export cannot be written to `path`, or None. Checked before the calibration runs (hours on a
    real pair), not when its result is written: the temporary file dump_export writes first is made here."""
    from calispec_tools.memory_file import export_target_problem

    if problem := export_target_problem(path):
        return f"cannot write --export {path}: {problem}"
    probe = path.with_name(path.name + ".tmp")
    existed = probe.exists()
    try:
        with probe.open("a"):  # "a": a stale temporary file is kept, not emptied; dump_export replaces it
            pass
        if not existed:  # only what the probe made: a file already there is not the probe's to remove
            probe.unlink()
    except OSError as exc:
        return f"cannot write --export {path}: {exc.strerror}"
    return None


def _memory_target(args: argparse.Namespace) -> tuple[str, str, str, TlsConfig | None]:
    """(address, namespace, writer token, TLS settings) of the memory service the events go to."""
    import grpc

    from calispec_tools.cli_memory import memory_address, memory_tls, resolve_namespace, writer_token

    tls = memory_tls(args, writes=True)  # the usage errors before any connection: the TLS files, then the token
    address = memory_address(args.memory_addr)
    token = writer_token(args.writer_token_file, address)
    try:
        namespace = resolve_namespace(address, args.namespace, tls)
    except grpc.RpcError as exc:
        raise SystemExit(f"error: {memory_failure(address, exc)}") from None
    return address, namespace, token, tls


def _load(args: argparse.Namespace, config: Any, draft: Path, target: Path) -> Any:
    from calispec_tools.calibrate.job import Calibrator, load_pair
    from calispec_tools.cli import served_draft_dtype

    print(f"loading the pair (draft {draft}, target {target})...", file=sys.stderr)
    pair = load_pair(draft, target, args.dtype, args.device, served_draft_dtype(args), args.int8_outliers)
    try:
        return Calibrator(*pair, config)
    except ValueError as exc:  # row scales this machine cannot give (Calibrator says why)
        raise SystemExit(f"error: cannot calibrate: {exc}") from None


def _run_local(
    args: argparse.Namespace,
    docs: Any,
    config: Any,
    draft: Path,
    target: Path,
    address: str,
    namespace: str,
    token: str,
    tls: TlsConfig | None,
) -> Any:
    import grpc

    from calispec_tools.calibrate.sink import MemoryWriter

    writer = MemoryWriter(address, namespace, token, tls=tls)
    try:
        try:
            writer.check()  # before the models load: reachable, the token, its namespaces
            calibrator = _load(args, config, draft, target)
            writer.vocab_size = calibrator.target.vocab_size
            writer.check()  # before the corpus runs (hours on a real pair): the namespace's vocabulary
            return calibrator.run(docs, writer.send, _print_progress)
        finally:
            writer.close()  # the last batch durably: the memory holds everything on return
    except KeyboardInterrupt:  # Ctrl-C said only "interrupted", as if nothing had been written
        stay = f"{writer.recorded:,} events sent before it stay" if writer.recorded else "no events were sent"
        print(f"calibrate: interrupted; {stay} in namespace {namespace}", file=sys.stderr)
        raise
    except grpc.RpcError as exc:  # a traceback, and only after the whole run (found by probing)
        sent = f" (events sent before it stay in namespace {namespace})" if writer.recorded else ""
        raise SystemExit(f"error: cannot calibrate: {memory_failure(address, exc)}{sent}") from None


def _to_export(args: argparse.Namespace, docs: Any, config: Any, draft: Path, target: Path) -> int:
    from calispec_tools.memory_file import MemoryFileError, dump_export
    from calispec_tools.namespaces import pair_namespace

    namespace = args.namespace or pair_namespace(draft, target)
    calibrator = _load(args, config, draft, target)
    summary = calibrator.run(docs, progress=_print_progress)
    kept = [(d, t, c) for (d, t), c in summary.pairs.items() if c >= args.min_count]
    vocab = calibrator.target.vocab_size
    try:
        dump_export(args.export, namespace, 0, kept, vocab, exported_at="")  # no timestamp: the same run, same bytes
    except MemoryFileError as exc:  # checked before the run; the place changed since
        return _fail(str(exc))
    _print_summary(summary.to_dict() | {"namespace": namespace, "exported_pairs": len(kept)}, summary.pairs, args.json)
    print(f"wrote {args.export}", file=sys.stderr)
    return 0


def _print_progress(summary: Any) -> None:
    """One stderr line a batch: a real pair's run takes an hour (docs/calibration.md). A stderr that is gone (a
    closed pipe, `2>&1 | head`) costs the lines, never the run."""
    minutes, seconds = divmod(int(summary.total_s), 60)
    line = (
        f"calibrate: {summary.rows} of {summary.rows_planned} rows, {summary.positions:,} positions, "
        f"{summary.events:,} events, {minutes}:{seconds:02d} elapsed"
    )
    with contextlib.suppress(OSError, ValueError):  # BrokenPipeError, or a closed file
        print(line, file=sys.stderr, flush=True)


def _print_summary(doc: dict[str, Any], pairs: Any, as_json: bool) -> None:
    counts = sorted(pairs.values(), reverse=True)
    head = counts[: -(-len(counts) // 5)]  # the top 20% of pairs (rounded up), as GetStats
    doc |= {"top20_share": sum(head) / sum(counts) if counts else 0.0, "pairs_over_lambda6": sum(c > 6 for c in counts)}
    if as_json:
        print(json.dumps(doc))
        return
    print(
        f"calibration: {doc['documents']} documents, {doc['rows']} rows, {doc['positions']} positions, "
        f"{doc['events']} events in {doc['distinct_pairs']} pairs ({doc['pairs_over_lambda6']} counted > 6; top 20% "
        f"of pairs cover {doc['top20_share']:.1%}) into {doc['namespace']}\n"
        f"time: {doc['total_s']:.1f} s (generate {doc['generate_s']:.1f} s, forward {doc['forward_s']:.1f} s): "
        f"{doc['events_per_s']:.1f} events/s"
        + (f"\nwarning: {doc['off_path']} positions are not the target's greedy choice" if doc["off_path"] else "")
    )


# -- standard SD through the stack ---------------------------------------------------------------


def read_prompts(path: Path) -> list[str]:
    """Plain text: one prompt per non-empty line. `.jsonl`: objects with a "prompt" string."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if path.suffix != ".jsonl":
        return lines
    prompts = []
    for i, line in enumerate(lines, 1):
        item = json.loads(line)
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise ValueError(f"{path}:{i}: expected an object with a 'prompt' string")
        prompts.append(item["prompt"])
    return prompts


def calibrate_by_sd(args: argparse.Namespace) -> int:
    import grpc

    from calispec.client import CalispecClient, CalispecRpcError
    from calispec_tools.cli_auth import checked_client_auth
    from calispec_tools.cli_memory import memory_address, memory_tls, resolve_namespace
    from calispec_tools.memory_reads import memory_events, wait_for_events
    from calispec_tools.stack_state import coordinator_address

    try:
        prompts = read_prompts(args.prompts)
    except (OSError, ValueError) as exc:
        return _fail(f"cannot read prompts: {exc}")
    if not prompts:
        return _fail(f"{args.prompts} holds no prompts")
    try:  # the coordinator's credentials (--tls-ca, CALISPEC_TLS_CA, --token): one line, not a traceback
        auth = checked_client_auth(args)
    except ValueError as exc:
        return _fail(str(exc), USAGE_ERROR)
    address, tls = memory_address(args.memory_addr), memory_tls(args)
    try:  # before any request: events sent to a memory service nobody can count would be lost
        namespace = resolve_namespace(address, args.namespace, tls)
        before = memory_events(address, namespace, tls=tls)
    except grpc.RpcError as exc:
        return _fail(memory_failure(address, exc))
    rejections = 0
    start = time.perf_counter()
    with CalispecClient(coordinator_address(args.address, DEFAULT_COORDINATOR), **auth) as client:
        for i, prompt in enumerate(prompts, 1):
            try:
                result = client.generate(
                    prompt, mode="sd", max_new_tokens=args.max_new_tokens,
                    num_speculative_tokens=args.gamma, timeout=args.timeout,
                )  # fmt: skip
            except CalispecRpcError as exc:
                return _fail(f"prompt {i}: {exc}")
            rejections += result.stats.rejections
            print(f"[{i}/{len(prompts)}] rejections {result.stats.rejections}", file=sys.stderr)
    # The target ships its events in the background: wait until the memory holds them all.
    try:
        seeded = wait_for_events(address, namespace, before + rejections, timeout_s=30, tls=tls) - before
    except grpc.RpcError as exc:
        return _fail(f"{memory_failure(address, exc)} (after {len(prompts)} prompts)")
    elapsed = time.perf_counter() - start
    print(
        f"calibration: {len(prompts)} prompts, {rejections} rejection events, {seeded} recorded in {namespace} "
        f"in {elapsed:.1f} s: {rejections / elapsed:.2f} events/s"
    )
    if seeded < rejections:
        return _fail("not every event reached the memory: is --namespace the one the stack's target writes to?")
    return 0

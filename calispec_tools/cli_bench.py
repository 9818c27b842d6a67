"""`calispec bench` and `calispec eval`: argparse wiring (calispec_tools/cli.py calls `register`).

Both drive a running coordinator (`--address HOST:PORT`) or start a local stack on free ports
(`--local`; the tiny offline pair unless `--draft/--target` are given).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import ssl
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calispec.types import Mode
from calispec_core.limits import (
    DEFAULT_LOCKSTEP_PHASE,
    DTYPE_CHOICES,
    INT8_OUTLIER_CHOICES,
    INT8_SPLIT,
    LOCKSTEP_PHASES,
)
from calispec_tools import arg_types as at
from calispec_tools.cli_auth import (
    add_client_auth_args,
    cannot_write_in,
    checked_client_auth,
    own_stack_auth,
    usage_error,
)

MODE_NAMES = [m.name.lower() for m in Mode]
LEVELS = at.csv_of(at.positive_int, "positive ints")  # --concurrency sweeps: 0 clients would measure nothing


@dataclass(frozen=True)
class Endpoints:
    coordinator: str
    memory: str | None  # the memory service, for the rejection analysis (None: skip it)
    namespace: str  # the pair's correction-memory namespace
    tokenizer: Path | None  # to label token ids in reports (None: ids only)
    writer_token_file: Path | None = None  # --local: the stack's verifier credential (calibration writes)


_modes = at.csv_choices(MODE_NAMES, "modes")


def interruptible(name: str) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """A command that may start a local stack, run as `up` and `demo` run (cli.stack_command): Ctrl-C and SIGTERM end
    it in one line (130, 143) with its stack stopped and its temporary files removed (a KeyboardInterrupt
    traceback; SIGTERM left the stack's directory and writer token behind), a stack that cannot start is one line."""

    def wrap(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        @functools.wraps(command)
        def run(args: argparse.Namespace) -> int:
            from calispec_tools.cli import stack_command

            return stack_command(name, lambda: command(args))

        return run

    return wrap


def add_prefix_cache_arg(parser: argparse.ArgumentParser, when: str = "") -> None:
    parser.add_argument(
        "--prefix-cache-tokens", type=at.non_negative_int, default=0,
        help=f"{when}the model services' prefix cache (default 0: off; the compared modes repeat each "
        "prompt, and a cache would give the later ones free prefills)",
    )  # fmt: skip


def add_lockstep_phase_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lockstep-phase", choices=LOCKSTEP_PHASES, default=None,
        help=f"the coordinator's rule for a lockstep round's γ (default: its own, {DEFAULT_LOCKSTEP_PHASE}; median: "
        "wave 6's cap; docs/performance.md)",
    )  # fmt: skip


def add_meaning_guard_arg(parser: argparse.ArgumentParser, when: str = "") -> None:
    parser.add_argument(
        "--no-meaning-guard", dest="meaning_guard", action="store_false",
        help=f"{when}let CSD rescue draft tokens that change a numeral, an operator or a special token, as the paper "
        "does (default: never; target_service/meaning_guard.py)",
    )  # fmt: skip


def add_target_args(parser: argparse.ArgumentParser, required: bool = True) -> argparse._MutuallyExclusiveGroup:
    """The coordinator to drive; returns the exclusive group naming it (required unless told otherwise)."""
    where = parser.add_mutually_exclusive_group(required=required)
    where.add_argument("--address", type=at.address, help="coordinator HOST:PORT of a running stack")
    where.add_argument("--local", action="store_true", help="start a local stack on free ports for this run")
    # --address with eval --ratio-analysis needs them (the stack's pair is not known here); --help said "the tiny pair"
    default = "default with --local: the tiny pair; with --address and --ratio-analysis: required"
    parser.add_argument("--draft", help=f"--local, eval --ratio-analysis: draft model dir ({default})")
    parser.add_argument("--target", help=f"--local, eval --ratio-analysis: target model dir ({default})")
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES)
    parser.add_argument(
        "--draft-dtype", default=None, choices=DTYPE_CHOICES, help="--local: the draft's (default int8 on CPU, as up)"
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--memory-address", type=at.address, help="memory service HOST:PORT (with --address; --local knows it)"
    )
    parser.add_argument("--tokenizer", help="tokenizer dir to label token ids (with --address)")
    parser.add_argument(
        "--memory-namespace",
        type=at.memory_namespace,
        default=None,
        help="with --address: the pair namespace (default: the running stack's, if it is that memory service, else "
        "the service's only one; calispec_tools/namespaces.py)",
    )
    add_prefix_cache_arg(parser, "--local: ")
    add_meaning_guard_arg(parser, "--local: ")
    parser.add_argument("--out", type=at.path_text, help="output directory (default: ./calispec-<command>-<time>)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots (no matplotlib needed)")
    add_client_auth_args(parser)
    return where


def model_dirs(args: argparse.Namespace) -> tuple[Path, Path]:
    """(draft, target) from --draft/--target, else the tiny offline pair (built on first use)."""
    from calispec_tools.cli import ensure_tiny_pair

    if bool(args.draft) != bool(args.target):
        raise SystemExit(usage_error("give both --draft and --target, or neither (the tiny pair)"))
    if args.draft:
        return Path(args.draft), Path(args.target)
    target, draft = ensure_tiny_pair()
    return draft, target


@contextmanager
def local_stack(args: argparse.Namespace, namespace: str | None = None) -> Iterator[Endpoints]:
    """A fresh stack on free ports with a fresh memory DB in a temporary directory; stopped afterwards.
    `namespace` None: the one the stack derives from the pair."""
    from calispec_tools.cli import served_draft_dtype
    from calispec_tools.stack import LocalStack, StackConfig

    draft, target = model_dirs(args)
    with tempfile.TemporaryDirectory(prefix="calispec-local-") as tmp:
        config = StackConfig(
            draft_model=draft, target_model=target, memory_db=Path(tmp) / "memory.db", log_dir=Path(tmp) / "logs",
            coordinator_port=0, target_port=0, draft_port=0, memory_port=0, dtype=args.dtype, device=args.device,
            draft_dtype=served_draft_dtype(args),
            memory_sync_interval_s=0.2,  # rescues in a short run need the shared counts soon
            memory_namespace=namespace, prefix_cache_tokens=args.prefix_cache_tokens,
            meaning_guard=args.meaning_guard,
        )  # fmt: skip
        print(f"starting a local stack (draft {draft}, target {target})...", file=sys.stderr)
        with LocalStack(config) as stack:
            memory = stack.memory_address
            yield Endpoints(stack.coordinator_address, memory, stack.memory_namespace, target, stack.writer_token_file)


@contextmanager
def endpoints(args: argparse.Namespace, reads_memory: bool = False) -> Iterator[Endpoints]:
    """The coordinator to drive; with --local, a fresh stack (fresh memory DB) that stops afterwards.
    `reads_memory` (eval): the memory service's namespace is resolved as the memory commands resolve theirs."""
    if args.local:
        with local_stack(args) as ep:
            yield ep
        return
    if not args.meaning_guard:  # a flag that would do nothing: the running stack's target decides
        raise SystemExit(usage_error("--no-meaning-guard applies to a --local stack (a running one: its target's)"))
    tokenizer = Path(args.tokenizer) if args.tokenizer else None
    namespace = args.memory_namespace
    if reads_memory and args.memory_address:  # as the memory commands resolve it: "default" was read, not written
        import grpc

        from calispec_tools.cli_memory import resolve_namespace
        from calispec_tools.memory_reads import memory_failure

        try:
            namespace = resolve_namespace(args.memory_address, namespace, flag="--memory-namespace")
        except grpc.RpcError as exc:
            raise SystemExit(f"error: {memory_failure(args.memory_address, exc)}") from None
    yield Endpoints(args.address, args.memory_address, namespace, tokenizer)


def coordinator_auth(args: argparse.Namespace) -> dict[str, Any]:
    """Client keyword arguments for the coordinator: --local's own stack runs open on loopback (no credentials,
    not even the environment's); --address: the flags', else the environment's, checked (ValueError: what the
    SDK cannot use, e.g. a missing --tls-ca)."""
    return own_stack_auth() if args.local else checked_client_auth(args)


def bench_auth(args: argparse.Namespace) -> dict[str, Any]:
    """The load's credentials, checked: with --openai-url the API key and the CA bundle of an https URL (the HTTP
    API serves the coordinator's keys and certificate: --tls-ca was ignored, so `calispec up --tls`'s API could not
    be reached; found by probing), else coordinator_auth's."""
    if not args.openai_url:
        return coordinator_auth(args)
    from calispec._channel import ClientAuth

    https = args.openai_url.startswith("https://")
    if args.tls_server_name:
        raise ValueError("--tls-server-name is for --address; with --openai-url the certificate must name its host")
    if args.tls_ca and not https:
        raise ValueError(f"--tls-ca is for an https:// --openai-url, not {args.openai_url}")
    # $CALISPEC_TLS_CA (left from a `calispec up --tls` session) applies to an https URL only, as elsewhere
    auth = ClientAuth.resolve(args.token, args.tls_ca if https else "")
    return {"token": auth.token, "tls_context": https_context(auth.tls_ca) if auth.tls_ca is not None else None}


def https_context(ca: Path) -> ssl.SSLContext:
    """A context that trusts `ca` only; ValueError naming the file when it holds no certificate ssl can load (a
    file that only looked like PEM was a traceback from the client; found by review)."""
    from calispec._channel import read_ca_bundle

    read_ca_bundle(ca)
    try:
        return ssl.create_default_context(cafile=str(ca))
    except ssl.SSLError as exc:
        raise ValueError(f"the TLS CA bundle {ca} holds no certificate ssl can load ({exc.reason or exc})") from None


def out_dir(args: argparse.Namespace, command: str) -> Path:
    """The output directory, checked now and made when the results are written (a run that fails or is refused
    leaves no empty one behind): one that could not be made is a usage error now, not a traceback after the run."""
    path = Path(args.out) if args.out else Path(f"calispec-{command}-{time.strftime('%Y%m%d-%H%M%S')}")
    existing = path.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    problem = cannot_write_in(existing) if existing.is_dir() else "Not a directory"
    if problem is not None:
        raise SystemExit(usage_error(f"cannot make the output directory {path}: {problem}"))
    return path


def out_file(text: str, flag: str) -> Path:
    """A results file (`flag`), checked before the run: its directory must take a file (it failed with a traceback
    after the whole run, its results lost)."""
    path = Path(text)
    problem = "it is a directory" if path.is_dir() else None
    if problem is None:
        problem = cannot_write_in(path.parent) if path.parent.is_dir() else f"no directory {path.parent}"
    if problem is not None:
        raise SystemExit(usage_error(f"{flag}: cannot write {path}: {problem}"))
    return path


# --- bench ---------------------------------------------------------------------------------------


def add_bench_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="load-test a coordinator: closed/open loop, modes side by side, sweeps; "
        "`bench compare`: the stack against HF assisted generation",
    )
    where = add_target_args(p, required=False)  # the load test checks it; `compare` starts its own stack
    where.add_argument(
        "--openai-url", type=at.http_url,
        help="drive the OpenAI-compatible HTTP API at this base URL (http://H:P/v1; https://H:P/v1 with --tls-ca "
        "for `calispec up --tls`)",
    )  # fmt: skip
    p.add_argument("--openai-model", help="with --openai-url: the model name (default: the one the server lists)")
    commands = p.add_subparsers(dest="bench_command", action=at.OwnFlagsSubcommands)
    add_compare_parser(commands)
    add_calibration_bench_parser(commands)
    p.add_argument("--modes", type=_modes, default=["ar", "sd", "csd"], help="comma-separated (default ar,sd,csd)")
    p.add_argument("--prompts", default="code,math,prose", help="built-in sets (code, math, prose) and/or JSONL files")
    loop = p.add_mutually_exclusive_group()
    loop.add_argument("--concurrency", type=LEVELS, help="closed loop; a list sweeps, e.g. 1,2,4,8 (default 1)")
    loop.add_argument(
        "--rate", type=at.csv_of(at.rate, "rates > 0"), help="open loop, requests/s; a list sweeps, e.g. 0.5,1,2"
    )
    p.add_argument(
        "--burstiness", type=at.positive_float, default=1.0, help="gamma shape of open-loop gaps (1 = Poisson)"
    )
    p.add_argument(
        "--num-requests", type=at.positive_int, default=30, help="measured requests per level, all modes together"
    )
    p.add_argument(
        "--duration", type=at.positive_float, default=None, help="per level: stop starting requests after N s"
    )
    p.add_argument(
        "--warmup", type=at.non_negative_int, default=None, help="warm-up requests per level (default: one per mode)"
    )
    p.add_argument(
        "--max-new-tokens", type=at.max_new_tokens, default=None, help="overrides the prompts' own (default 64)"
    )
    p.add_argument("--gamma", type=at.gamma, default=None)
    p.add_argument("--tau", type=at.tau, default=None)
    p.add_argument("--lambda", dest="lambda_", metavar="LAMBDA", type=at.lambda_, default=None)
    p.add_argument("--temperature", type=at.temperature, default=0.0)  # what a request takes: 150 failed each
    p.add_argument("--seed", type=at.non_negative_int, default=0)
    p.add_argument("--timeout", type=at.positive_float, default=300.0, help="per-request deadline, seconds")
    p.add_argument(
        "--ignore-eos", action="store_true", help="every request runs to its token limit (outputs of a fixed length)"
    )
    p.set_defaults(func=cmd_bench)


@interruptible("calispec bench")
def cmd_bench(args: argparse.Namespace) -> int:
    if not (args.address or args.local or args.openai_url):
        return usage_error("give --address HOST:PORT, --local or --openai-url (or use `calispec bench compare`)")
    from calispec_tools.bench import report
    from calispec_tools.bench.prompts import load_prompts
    from calispec_tools.bench.runner import Level, LoadConfig

    try:
        prompts = load_prompts(args.prompts)
    except (OSError, ValueError) as exc:  # a file missing, empty, not JSON lines of prompts: one line, not a traceback
        return usage_error(f"--prompts: {exc}")
    if args.rate:
        levels = [Level(rate=r) for r in args.rate]
    else:
        levels = [Level(concurrency=c) for c in (args.concurrency or [1])]
    config = LoadConfig(
        modes=tuple(args.modes), num_requests=args.num_requests, duration_s=args.duration,
        warmup_requests=args.warmup, burstiness=args.burstiness, seed=args.seed, max_new_tokens=args.max_new_tokens,
        gamma=args.gamma, tau=args.tau, lambda_=args.lambda_, temperature=args.temperature, timeout_s=args.timeout,
        ignore_eos=args.ignore_eos,
    )  # fmt: skip
    try:  # credentials the SDK cannot use: one line, exit 2, before any output or stack
        auth = bench_auth(args)
    except ValueError as exc:
        return usage_error(exc)
    out = out_dir(args, "bench")
    from calispec.client import CalispecRpcError

    try:
        address, results = run_bench(args, prompts, config, levels, auth)
    except CalispecRpcError as exc:  # the OpenAI server's model list, before any request: not reached, key refused
        print(f"error: {args.openai_url or args.address or 'the local stack'}: {exc}", file=sys.stderr)
        return 1
    print(report.format_table(results))
    full_config = {
        "load": config.to_dict(), "levels": [lv.__dict__ for lv in levels], "address": address,
        "local": args.local, "prompts": {"spec": args.prompts, "texts": [p.__dict__ for p in prompts]},
        "argv": sys.argv[1:],
    }  # fmt: skip
    written = [report.write_json(out / "bench.json", full_config, results)]
    if not args.no_plots:
        written += report.write_plots(out, results)
    print("\nwrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0 if any(lv["total"]["ok"] for lv in results) else 1


def run_bench(
    args: argparse.Namespace, prompts: list[Any], config: Any, levels: list[Any], auth: dict[str, Any]
) -> tuple[str, list[dict[str, Any]]]:
    """(the address driven, the sweep's results): the HTTP API at --openai-url, else the coordinator."""
    from calispec_tools.bench.runner import run_sweep

    if args.openai_url:
        from calispec_tools.bench.openai_client import OpenAIStreamClient

        client = OpenAIStreamClient(
            args.openai_url, args.timeout, args.openai_model, auth["token"] or "unused", auth["tls_context"]
        )
        return args.openai_url, asyncio.run(run_sweep(args.openai_url, prompts, config, levels, client=client))
    with endpoints(args) as ep:
        return ep.coordinator, asyncio.run(run_sweep(ep.coordinator, prompts, config, levels, client_options=auth))


def add_compare_parser(sub: Any) -> None:
    p = sub.add_parser(
        "compare",
        help="the stack's ar/sd/csd against HF generate() and assisted generation, same prompts and dtype, "
        "then throughput by concurrency",
    )
    p.add_argument("--pair", default="qwen-coder", help="a pulled pair (default qwen-coder) or `tiny`")
    p.add_argument("--draft", help="draft model dir (with --target; overrides --pair)")
    p.add_argument("--target", help="target model dir")
    p.add_argument("--prompts", type=at.positive_int, default=4,
                   help="how many of the built-in prompts (4: code, code, math, prose; repeated if more)")  # fmt: skip
    p.add_argument("--kinds", type=at.csv_of(str, "kinds"), default=["code", "math", "prose"],
                   help="which kinds of built-in prompt to take them from, e.g. `prose`")  # fmt: skip
    p.add_argument("--max-new-tokens", type=at.max_new_tokens, default=128)
    p.add_argument("--gamma", type=at.gamma, default=None, help="fixed γ for sd/csd (default: the stack's adaptive γ)")
    p.add_argument("--concurrency", type=LEVELS, default=[1, 4, 8], help="load levels (empty: skip the load test)")
    p.add_argument(
        "--load-requests", type=at.non_negative_int, default=0, help="requests per level and mode (0: twice the level)"
    )
    p.add_argument(
        "--load-repeats", type=at.positive_int, default=1,
        help="runs of each level, the modes alternating, each run starting with the next mode "
        "(ar sd csd, sd csd ar, ...); medians and paired ratios reported",
    )  # fmt: skip
    p.add_argument("--skip-hf", action="store_true", help="the stack only (no in-process transformers runs)")
    p.add_argument(
        "--batch-gather-ms", type=at.milliseconds_or_zero, default=None,
        help="the model services' --batch-gather-ms (default: theirs; 0: no gathering)",
    )  # fmt: skip
    add_prefix_cache_arg(p)
    p.add_argument(
        "--ride-prefill-tokens", type=at.non_negative_int, default=None,
        help="the model services' --ride-prefill-tokens (default: theirs; 0: every prompt prefills on its own)",
    )  # fmt: skip
    add_int8_outliers_arg(p)
    add_lockstep_phase_arg(p)
    p.add_argument("--json", help="also write everything to this JSON file")
    from calispec_tools.cli import add_model_flavour_args

    add_model_flavour_args(p)
    p.set_defaults(func=cmd_compare)


@interruptible("calispec bench compare")
def cmd_compare(args: argparse.Namespace) -> int:
    from calispec_tools.bench.compare import run_compare
    from calispec_tools.bench.pair import PROMPTS
    from calispec_tools.models.registry import PAIRS, chat_prompt

    unknown = set(args.kinds) - set(PROMPTS)
    if unknown or not args.kinds:
        return usage_error(f"--kinds: choose from {', '.join(PROMPTS)} (got {', '.join(sorted(unknown)) or 'none'})")
    texts = [t for kind, ts in PROMPTS.items() if kind in args.kinds for t in ts]
    texts = [texts[i % len(texts)] for i in range(max(args.prompts, 1))]
    if args.json:
        out_file(args.json, "--json")
    args.model_dirs = bench_pair_dirs(args)
    if not (args.draft and args.target) and args.pair != "tiny":
        texts = [chat_prompt(PAIRS[args.pair], t) for t in texts]
    args.prompt_texts = texts
    return run_compare(args)


def bench_pair_dirs(args: argparse.Namespace) -> tuple[Path, Path]:
    """(draft, target): --draft/--target, else --pair (`tiny` is built offline; others must be pulled)."""
    if bool(args.draft) != bool(args.target):  # half a pair ran --pair's, silently
        raise SystemExit(usage_error("give both --draft and --target, or neither (--pair)"))
    if args.draft and args.target:
        return Path(args.draft), Path(args.target)
    if args.pair == "tiny":
        from calispec_tools.cli import ensure_tiny_pair

        target, draft = ensure_tiny_pair()
        return draft, target
    from calispec_tools.cli import ensure_pulled_pair

    return ensure_pulled_pair(args.pair)


def add_int8_outliers_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--int8-outliers", choices=INT8_OUTLIER_CHOICES, default=None,
        help="int8 models' --int8-outliers (default: the services', split; shared: torch's one scale a call)",
    )  # fmt: skip


def add_calibration_bench_parser(sub: Any) -> None:
    p = sub.add_parser(
        "calibration",
        help="events/s of teacher-forced calibration against calibrating by SD through the stack, one run",
    )
    p.add_argument("--pair", default="qwen-coder", help="a pulled pair (default qwen-coder) or `tiny`")
    p.add_argument("--draft", help="draft model dir (with --target; overrides --pair)")
    p.add_argument("--target", help="target model dir")
    p.add_argument("--prompts", type=at.positive_int, default=16, help="prompts of the shipped calibration corpus")
    p.add_argument("--max-new-tokens", type=at.max_new_tokens, default=64)
    p.add_argument("--gamma", type=at.gamma, default=6, help="fixed γ of the SD run (and of the sd events)")
    p.add_argument(
        "--batch-size", type=at.positive_int, default=32, help="teacher-forced rows a batch (as `make calibration`)"
    )
    p.add_argument(
        "--max-tokens", type=at.window_tokens, default=512, help="text documents are cut into windows this long"
    )
    p.add_argument("--no-text", action="store_true", help="skip the dense run over the corpus's text documents")
    p.add_argument(
        "--rounds", type=at.positive_int, default=4,
        help="interleave the methods (default 4 rounds): each round runs SD on its share of the prompts, then teacher "
        "forcing on the same share and over the whole text (the pair loaded in both the stack and this process; "
        "where it does not fit twice, SD's rounds run first and teacher forcing after them, the stack stopped; 1: "
        "that order)",
    )  # fmt: skip
    add_int8_outliers_arg(p)  # the stack's services and the teacher-forced runners alike
    from calispec_tools.cli_calibrate import add_int8_scales_arg

    add_int8_scales_arg(p)  # the teacher-forced draft's, as `calispec calibrate`
    from calispec_tools.cli import add_model_flavour_args

    add_model_flavour_args(p, serves_csd=False)  # it runs SD only, and counts the events it adds to an empty memory
    p.set_defaults(func=cmd_calibration_bench)


@interruptible("calispec bench calibration")
def cmd_calibration_bench(args: argparse.Namespace) -> int:
    from calispec_tools.bench.calibration import run_calibration_bench
    from calispec_tools.cli_auth import USAGE_ERROR
    from calispec_tools.cli_calibrate import int8_scales_problem

    if problem := int8_scales_problem(args):
        print(f"error: {problem}", file=sys.stderr)
        return USAGE_ERROR

    args.model_dirs = bench_pair_dirs(args)
    return run_calibration_bench(args)


# --- eval ----------------------------------------------------------------------------------------


def add_eval_parser(sub: Any) -> None:
    from calispec_tools.eval.runner import PAPER_MODES
    from calispec_tools.eval.tasks import PROMPT_FORMATS, TASK_KINDS, TASK_SETS

    p = sub.add_parser("eval", help="accuracy and speed per decoding mode; rejection analysis")
    add_target_args(p)
    p.add_argument("--modes", type=_modes, default=list(PAPER_MODES), help="default: ar,sd,csd,ocm_only,scg_only")
    p.add_argument(
        "--tasks",
        type=at.csv_choices(TASK_KINDS, "task kinds"),
        default=list(TASK_KINDS),
        help="task kinds: code, math",
    )
    p.add_argument(
        "--task-set", default="eval", choices=sorted(TASK_SETS),
        help="eval: the reported tasks; dev: held-out tuning tasks (choose λ, τ there, then run eval)",
    )  # fmt: skip
    p.add_argument("--limit", type=at.positive_int, default=None, help="first N tasks of each kind (quick runs)")
    p.add_argument(
        "--sweep-tau", type=at.csv_of(at.tau, "τ values"), default=[], help="csd τ values, e.g. 0.001,0.01,0.1"
    )
    p.add_argument(
        "--sweep-lambda", type=at.csv_of(at.lambda_, "λ values"), default=[], help="csd λ values, e.g. 2,6,10"
    )
    p.add_argument("--max-new-tokens", type=at.max_new_tokens, default=256)
    p.add_argument("--gamma", type=at.gamma, default=6, help="fixed γ (the paper's; adaptive γ may not draft at all)")
    p.add_argument("--prompt-format", default="raw", choices=PROMPT_FORMATS, help="qwen-chat for instruct pairs")
    p.add_argument("--timeout", type=at.positive_float, default=300.0, help="per-request deadline, seconds")
    p.add_argument("--sandbox-timeout", type=at.positive_float, default=10.0, help="per code task, seconds")
    p.add_argument(
        "--ratio-analysis", action="store_true",
        help="also load the pair in this process (--draft/--target; with --local they default to the tiny pair) and "
        "measure the target "
        "probability ratio p(draft)/p(target) of every rejection under greedy SD over the tasks (not with "
        "--calibration-study)",
    )  # fmt: skip
    p.add_argument(
        "--ratio-top", type=at.positive_int, default=15, help="pairs in the ratio report (most frequent first)"
    )
    p.add_argument(
        "--calibration-study", action="store_true",
        help="with --local: every mode on a fresh stack per calibration (--calibrations): none, the shipped "
        "calibration, task-like text; teacher-forced in this process",
    )  # fmt: skip
    p.add_argument(
        "--calibrations", default=None, help="the study's calibrations, comma-separated (default none,shipped,task)"
    )
    p.add_argument(
        "--calibration-limit", type=at.positive_int, default=None,
        help="task calibration: prompts per task kind (default: --limit, else every prompt of the set)",
    )  # fmt: skip
    p.add_argument(
        "--calibration-batch-size", type=at.positive_int, default=8,
        help="documents a batch when calibrating here (as `calispec calibrate --batch-size`)",
    )  # fmt: skip
    p.set_defaults(func=cmd_eval)


def _decoder(tokenizer_dir: Path | None) -> Any:
    if tokenizer_dir is None:
        return None
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    except (OSError, ValueError) as exc:
        print(f"warning: no tokenizer labels ({exc})", file=sys.stderr)
        return None
    return lambda token_id: tok.decode([token_id])


def eval_args_problem(args: argparse.Namespace) -> str | None:
    """Why these eval flags cannot run together, or None (checked before any stack starts)."""
    if args.calibration_study and not args.local:
        return "--calibration-study starts a fresh stack per variant: use it with --local"
    if args.calibration_study and args.ratio_analysis:  # the study reports no ratios: refused, never dropped
        return "--ratio-analysis does not run in --calibration-study: run them as two evals"
    if args.ratio_analysis and not args.local and not (args.draft and args.target):
        return "--ratio-analysis loads the pair in this process: give --draft and --target (or --local)"
    if bool(args.draft) != bool(args.target):
        return "give both --draft and --target, or neither (the tiny pair)"
    if args.draft and not (args.local or args.ratio_analysis):  # the running stack serves its own pair
        return "--draft and --target name the pair of a --local stack or of --ratio-analysis"
    if args.calibrations is not None and not args.calibration_study:
        return "--calibrations applies to --calibration-study"
    if args.calibration_study:
        try:
            study_calibrations(args)
        except argparse.ArgumentTypeError as exc:
            return str(exc)
    return None


def study_calibrations(args: argparse.Namespace) -> list[str]:
    """--calibrations as a list (default: every calibration of the study); ArgumentTypeError for one it has not."""
    from calispec_tools.eval.calibration import STUDY_VARIANTS

    given = ",".join(STUDY_VARIANTS) if args.calibrations is None else args.calibrations
    return at.csv_choices(STUDY_VARIANTS, "--calibrations")(given)


def _ratio_analysis(args: argparse.Namespace, tasks: list[Any], config: Any) -> dict[str, Any]:
    """Offline: both models in this process, greedy SD over the tasks (after any stack has stopped)."""
    from calispec_tools.eval import ratios
    from calispec_tools.eval.tasks import render

    draft, target = model_dirs(args)
    print(f"ratio analysis: greedy SD in process over {len(tasks)} tasks...", file=sys.stderr)
    sd = ratios.SdConfig(gamma=args.gamma or ratios.SdConfig.gamma, max_new_tokens=config.max_new_tokens)
    prompts = [render(t, config.prompt_format) for t in tasks]
    return ratios.run(draft, target, prompts, sd, args.dtype, args.device, top=args.ratio_top)


CALIBRATION_NEW_TOKENS = 96  # the target's continuation per calibration prompt (as `make calibration`)


def _study_calibrate(args: argparse.Namespace, config: Any, kinds: list[str]) -> Any:
    """The study's CalibrateFn: the shipped file if the pair has one, else teacher-forced here (models loaded once)."""
    from calispec_tools.calibrate.job import CalibrateConfig, Calibrator, load_pair
    from calispec_tools.calibrate.sink import MemoryWriter
    from calispec_tools.cli import served_draft_dtype
    from calispec_tools.eval.calibration import calibration_documents
    from calispec_tools.shipped_calibration import seed_namespace, shipped_for_namespace

    loaded: list[Calibrator] = []
    per_kind = args.calibration_limit if args.calibration_limit is not None else args.limit

    def calibrator() -> Calibrator:
        if not loaded:
            draft_dir, target_dir = model_dirs(args)
            # the int8 outlier rule the stack's services run by default (the study starts them with theirs)
            pair = load_pair(draft_dir, target_dir, args.dtype, args.device, served_draft_dtype(args), INT8_SPLIT)
            cfg = CalibrateConfig(generate=True, gamma=args.gamma or 6, max_new_tokens=CALIBRATION_NEW_TOKENS,
                                  batch_size=args.calibration_batch_size)  # fmt: skip
            loaded.append(Calibrator(*pair, cfg))
        return loaded[0]

    def calibrate(label: str, ep: Any) -> dict[str, Any]:
        if label == "none":
            return {"source": "none", "events": 0}
        shipped = shipped_for_namespace(ep.namespace) if label == "shipped" else None
        if shipped is not None:
            result = seed_namespace(ep.memory, ep.namespace, shipped, ep.writer_token)
            return {"source": shipped.name, "loaded": result.loaded, "message": result.message}
        docs = calibration_documents(label, kinds, per_kind, config.prompt_format)
        cal = calibrator()
        writer = MemoryWriter(ep.memory, ep.namespace, ep.writer_token, cal.target.vocab_size)
        try:
            summary = cal.run(docs, writer.send)
        finally:
            writer.close()
        return {"source": "teacher-forced here", **summary.to_dict()}

    return calibrate


def _calibration_study(
    args: argparse.Namespace, tasks: list[Any], variant_list: list[Any], config: Any, progress: Any
) -> dict[str, Any]:
    from calispec_core.credentials import read_writer_token
    from calispec_tools.eval.calibration import StudyEndpoints, run_study

    @contextmanager
    def fresh_stack(variant: str) -> Iterator[StudyEndpoints]:
        with local_stack(args) as ep:  # a fresh DB per calibration; the pair's own namespace
            assert ep.memory is not None and ep.writer_token_file is not None
            token = read_writer_token(ep.writer_token_file)
            assert token is not None
            yield StudyEndpoints(ep.coordinator, ep.memory, ep.namespace, token)

    kinds = list(dict.fromkeys(t.kind for t in tasks))
    calibrations = study_calibrations(args)  # checked by eval_args_problem
    calibrate = _study_calibrate(args, config, kinds)
    return run_study(fresh_stack, calibrate, tasks, variant_list, config, progress, calibrations)


def _progress(total: int) -> Any:
    done = 0

    def progress(row: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        label = f"{row.get('calibration', '')} {row['variant']}".strip()
        print(f"\r[{done}/{total}] {row['task']} {label}: {row['status']}".ljust(70), end="", file=sys.stderr)

    return progress


def _eval_study(args: argparse.Namespace, tasks: list[Any], variant_list: list[Any], config: Any, out: Path) -> int:
    """--calibration-study: the paper-style table per calibration, the rejection concentration, eval.json."""
    from calispec_tools.eval import report
    from calispec_tools.eval.calibration import study_plan

    calibrations = study_calibrations(args)  # checked by eval_args_problem
    progress = _progress(len(tasks) * sum(map(len, study_plan(calibrations, variant_list).values())))
    study = _calibration_study(args, tasks, variant_list, config, progress)
    print(file=sys.stderr)
    print("calibration study (greedy; speed vs ar on the same fresh stack, else the reference calibration's):")
    print(report.format_study(study["summary"]))
    print("\n" + report.format_concentration(study["calibration"]))
    doc = {
        "config": {**config.to_dict(), "local": True, "tasks": ",".join(args.tasks), "task_set": args.task_set,
                   "limit": args.limit,
                   "variants": [v.label for v in variant_list], "calibrations": calibrations, "argv": sys.argv[1:]},
        "calibration_study": study, "rows": study["rows"],
    }  # fmt: skip
    written = [report.write_json(out / "eval.json", doc)]
    if not args.no_plots:
        written.append(report.plot_concentration(out / "concentration.png", study["calibration"]))
    print("\nwrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0 if any(r["error"] is None for r in study["rows"]) else 1


@interruptible("calispec eval")
def cmd_eval(args: argparse.Namespace) -> int:
    from calispec_tools.eval import report
    from calispec_tools.eval.rejections import PROBABILITY_RATIO_NOTE, analyse, gained, table_summary
    from calispec_tools.eval.runner import EvalConfig, run_eval, variants
    from calispec_tools.eval.tasks import TASK_SETS, load_tasks
    from calispec_tools.memory_reads import fetch_pairs, memory_events, memory_failure, wait_for_events

    if problem := eval_args_problem(args):
        return usage_error(problem)
    try:  # credentials the SDK cannot use: one line, exit 2, before any output or stack
        auth = coordinator_auth(args)
    except ValueError as exc:
        return usage_error(exc)
    try:
        tasks = load_tasks(args.tasks, TASK_SETS[args.task_set], limit=args.limit)
    except ValueError as exc:  # an unknown kind: one line, not a traceback
        return usage_error(f"--tasks: {exc}")
    variant_list = variants(args.modes, args.sweep_tau, args.sweep_lambda)
    config = EvalConfig(args.max_new_tokens, args.gamma, args.prompt_format, args.timeout, args.sandbox_timeout)
    out = out_dir(args, "eval")
    if args.calibration_study:
        return _eval_study(args, tasks, variant_list, config, out)
    progress = _progress(len(tasks) * len(variant_list))

    import grpc

    with endpoints(args, reads_memory=True) as ep:
        try:  # a memory service that does not answer: one line, not a traceback
            before = memory_events(ep.memory, ep.namespace) if ep.memory else 0
            table_before = fetch_pairs(ep.memory, ep.namespace) if ep.memory else []
            rows = run_eval(ep.coordinator, tasks, variant_list, config, progress, client_options=auth)
            print(file=sys.stderr)
            analysis = None
            if ep.memory:
                expected = before + sum(r["stats"]["rejections"] for r in rows if r["stats"])
                wait_for_events(ep.memory, ep.namespace, expected)
                table = fetch_pairs(ep.memory, ep.namespace)
                # this run's rejections (a seeded calibration's counts are not the run's), then the whole table
                analysis = analyse(gained(table_before, table), _decoder(ep.tokenizer))
                analysis["memory_table"] = table_summary(table)
        except grpc.RpcError as exc:
            print(f"error: {memory_failure(ep.memory or '', exc)}", file=sys.stderr)
            return 1
    ratios = _ratio_analysis(args, tasks, config) if args.ratio_analysis else None
    if ratios is not None or analysis is not None:
        analysis = {**(analysis or {}), "probability_ratio": ratios or PROBABILITY_RATIO_NOTE}
    summary = report.summarize(rows)
    print(report.format_table(summary))
    if analysis is not None and "events" in analysis:
        print("\n" + report.format_rejections(analysis))
    if ratios is not None:
        print("\n" + report.format_ratios(ratios))
    doc = {
        "config": {**config.to_dict(), "address": ep.coordinator, "local": args.local, "tasks": ",".join(args.tasks),
                   "task_set": args.task_set,
                   "limit": args.limit, "variants": [v.label for v in variant_list], "argv": sys.argv[1:],
                   "order": "per task, every variant in turn (the memory learns online across the run)"},
        "summary": summary, "rejections": analysis, "memory_namespace": ep.namespace,
        "calibration_study": "not run (--calibration-study)", "rows": rows,
    }  # fmt: skip
    written = [report.write_json(out / "eval.json", doc)]
    if not args.no_plots:
        if analysis is not None and "events" in analysis:
            written.append(report.plot_rejections(out / "rejections.png", analysis))
        if ratios is not None:
            written.append(report.plot_ratios(out / "ratios.png", ratios, args.ratio_top))
    print("\nwrote " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0 if any(r["error"] is None for r in rows) else 1


def register(subparsers: Any) -> None:
    """Adds `bench` and `eval` to calispec's subcommands (called from calispec_tools/cli.py)."""
    add_bench_parser(subparsers)
    add_eval_parser(subparsers)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (`python -m calispec_tools.cli_bench bench ...`) until cli.py wires `register`."""
    parser = argparse.ArgumentParser(prog="calispec")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

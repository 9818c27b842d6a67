"""A local stack: the four services as subprocesses on loopback, started in dependency order.

Used by `calispec up`, `calispec demo` and the end-to-end tests. Each service prints one
readiness line (`<name> listening on HOST:PORT ...`) once it serves; ports may be 0, and
the bound port is read from that line.

A stack owns its log directory while it runs (`logs.lock` there): a second stack given the same
one is refused before it starts anything, so two stacks never write one log. Each start moves the
previous run's logs aside (`<service>.log.1` ... `.3`, the oldest dropped).
"""

from __future__ import annotations

import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from calispec_core.credentials import write_new_token
from calispec_core.generation import Defaults
from calispec_core.interrupts import SIGNAL_POLL_S
from calispec_core.limits import LockstepPhase
from calispec_tools.certs import DevCerts
from calispec_tools.namespaces import pair_namespace
from calispec_tools.shipped_calibration import SeedResult, seed_namespace, served_lambda
from calispec_tools.stack_state import StackBusy, StackLock, private_temp_dir, remove_orphaned_secrets

log = logging.getLogger(__name__)

BANNER = re.compile(r"^(\w+) listening on (\S+):(\d+)")
HTTP_URL = re.compile(r"(https?://\S+/v1)")  # the coordinator's banner names its OpenAI-compatible API
METRICS_BANNER = re.compile(r"^(\w+) metrics on (\S+)")
# not stack_state's `stack.lock`: `up --log-dir` on the user data dir would then take the lock it already holds
LOG_DIR_LOCK = "logs.lock"
LOG_BACKUPS = 3  # a service's logs of earlier runs kept beside this run's: <name>.log.1 (the last run) ... .3


def split_cores(cores: int) -> tuple[int, int]:
    """(draft, target) torch threads on one machine: disjoint shares, so the two never oversubscribe
    the cores when both compute (concurrent requests); the target, ~3x the draft's cost per forward,
    gets the larger share."""
    if cores <= 1:
        return 1, 1
    draft = max(1, cores // 3)
    return draft, cores - draft


def service_threads(config: StackConfig) -> tuple[int | None, int | None]:
    """(draft, target) threads: explicit ones win; with neither given, all cores each where the two take
    turns (a compute lock on CPU), else the machine's cores split between them."""
    if config.draft_threads is None and config.target_threads is None:
        return (None, None) if compute_lock_path(config) else split_cores(os.cpu_count() or 1)
    return config.draft_threads, config.target_threads


def threads_label(threads: int | None) -> int | str:
    """A service's torch threads as benchmarks print them (None: the service's default, every core)."""
    return "all cores" if threads is None else threads


def compute_lock_path(config: StackConfig) -> Path | None:
    """The lock file the model services share on CPU, so their forwards take turns (calispec_core/host_lock.py);
    None where they compute apart (a GPU) or the stack was told not to."""
    return config.log_dir / "compute.lock" if config.compute_lock and runs_on_cpu(config.device) else None


def runs_on_cpu(device: str) -> bool:
    if device == "auto":
        import torch

        return not torch.cuda.is_available()
    return device == "cpu"


def default_draft_dtype(device: str) -> str | None:
    """int8 on CPU (dynamic quantisation: a draft step several times cheaper; the output stays exact
    w.r.t. the target), else None (the target's dtype)."""
    return "int8" if runs_on_cpu(device) else None


def default_draft_vocab(pair: str | None, device: str) -> int:
    """A known pair's pruned draft output layer on CPU (its registry entry), else 0: the full layer."""
    from calispec_tools.models.registry import PAIRS

    spec = PAIRS.get(pair or "")
    return spec.cpu_draft_vocab if spec is not None and runs_on_cpu(device) else 0


def _threads_args(threads: int | None) -> list[str]:
    return [] if threads is None else ["--threads", str(threads)]


@dataclass(frozen=True)
class StackConfig:
    draft_model: Path
    target_model: Path
    memory_db: Path
    log_dir: Path
    host: str = "127.0.0.1"
    coordinator_port: int = 50050
    target_port: int = 50051
    draft_port: int = 50052
    memory_port: int = 50053
    http_port: int | None = None  # the coordinator's OpenAI-compatible HTTP API (0: a free port); None: off
    dtype: str = "auto"
    device: str = "auto"
    draft_dtype: str | None = None  # None: `dtype` (e.g. int8 for a cheaper draft)
    draft_threads: int | None = None  # None with target_threads None: split_cores(os.cpu_count())
    draft_vocab: int = 0  # the draft's output layer pruned to ids [0, K) plus the special tokens; 0: full
    fp32_linear: str | None = None  # both model services' float32 (bf16) CPU Linear path (None: theirs, auto)
    target_threads: int | None = None
    prefix_cache_tokens: int | None = None  # the model services' prefix cache (None: their default; 0: off)
    ride_prefill_tokens: int | None = None  # prompts up to this long prefill in their first batch (None: default)
    int8_outliers: str | None = None  # int8 models' first-token outlier rows: split or shared (None: theirs, split)
    default_tau: float | None = None  # the coordinator's τ and λ for requests that set none (None: the paper's)
    default_lambda: int | None = None
    memory_sync_interval_s: float = 1.0
    memory_flush_interval_s: float = 0.5  # the memory service's group commit (its crash-loss bound)
    memory_namespace: str | None = None  # None: derived from the model pair (calispec_tools/namespaces.py)
    calibration_file: Path | None = None  # an export seeded into a never-written namespace (shipped_calibration.py)
    # (target dtype, λ) chosen for that calibration: the coordinator's default λ when default_lambda is None and
    # the target serves one of these dtypes (shipped_calibration.CHOSEN_LAMBDA)
    calibration_lambdas: tuple[tuple[str, int], ...] = ()
    start_timeout_s: float = 300.0
    tls_dir: Path | None = None  # `calispec certs dev` output: mutual TLS between all four; None: plaintext
    api_keys_file: Path | None = None  # the coordinator's API keys; None: open (loopback only)
    target_replicas: int = 1  # replica i > 0 is named `target_service:i` and listens on target_port + i (or 0)
    session_idle_ttl_s: float | None = None  # draft and target sessions; None: the services' default
    batch_gather_ms: float | None = None  # draft and target batchers (--batch-gather-ms); None: the default
    meaning_guard: bool = True  # the target's CSD never rescues a changed numeral or operator (meaning_guard.py)
    compute_lock: bool = True  # on CPU the model services' forwards take turns (calispec_core/host_lock.py)
    lockstep_phase: LockstepPhase | None = None  # the coordinator's --lockstep-phase (None: its default)
    tool_call_parser: str | None = None  # the coordinator's --tool-call-parser (None: no tool calling)
    metrics: bool = False  # serve /metrics per service (`calispec up` prints the URLs)
    # with metrics: the first of METRICS_ORDER's /metrics ports, the others on the next ones (0: a free port each)
    metrics_port: int = 0
    log_level: str = "INFO"


METRICS_ORDER = ("coordinator", "target_service", "draft_service", "memory_service")  # StackConfig.metrics_port + i


class StackStartError(RuntimeError):
    """The stack cannot start for a reason its user must fix; `line`: why, in one line (the CLI's usage error)."""

    def __init__(self, message: str, line: str) -> None:
        super().__init__(message)
        self.line = line


class ServiceStartError(StackStartError):
    """A service exited before it served. str(): its log's tail; `line`: why, in one line (the CLI's error)."""


@contextmanager
def user_path() -> Iterator[None]:
    """Around a start-up step that writes a path the user chose (--log-dir, --tls-dir): an OSError there is
    theirs to fix, a StackStartError naming the path. Other OSErrors (and any later) stay what they are."""
    try:
        yield
    except OSError as exc:
        raise StackStartError(str(exc), f"cannot use {exc.filename or 'a path'}: {exc.strerror or exc}") from exc


def _open_log(path: Path) -> IO[bytes]:
    """A service's log, to append to (in --log-dir: an OSError is the user's to fix)."""
    with user_path():
        return open(path, "ab")


def rotate_log(path: Path, keep: int = LOG_BACKUPS) -> None:
    """Move the previous run's log to `<name>.1`, the older ones one number up, dropping the one past `keep`
    (logrotate's scheme): a run's log starts empty and the directory stays bounded. Only under the directory's
    lock, so no live stack writes these files (a service left running by a killed launcher keeps writing to
    its file, renamed: never into this run's)."""
    with user_path():
        for number in range(keep, 0, -1):
            older = path.with_name(f"{path.name}.{number - 1}") if number > 1 else path
            with suppress(FileNotFoundError):
                older.replace(path.with_name(f"{path.name}.{number}"))


def claim_log_dir(log_dir: Path) -> StackLock:
    """The log directory's lock, taken; a directory a live stack holds is a one-line usage error naming it."""
    try:
        with user_path():
            return StackLock(log_dir / LOG_DIR_LOCK).acquire()
    except StackBusy as busy:
        line = (
            f"{log_dir} is the log directory of a running stack ({busy.holder or 'pid unknown'}): "
            "stop it (`calispec down` stops `calispec up`'s) or give another --log-dir"
        )
        raise StackStartError(str(busy), line) from None


STOP_ORDER = ("coordinator", "draft_service", "target_service", "memory_service")  # the reverse of start


@dataclass
class ServiceProcess:
    name: str
    process: subprocess.Popen[str]
    log_path: Path
    args: list[str]  # as started (after `--host`)
    port: int = 0
    banner: str = ""  # the readiness line
    metrics_url: str | None = None
    log_start: int = 0  # where this start's lines begin in the log file (a restart appends to it)
    _lines: queue.Queue[str | None] = field(default_factory=queue.Queue)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def pump(self, stream: IO[str]) -> None:
        """Forward the child's stdout to the queue until it closes (runs in a thread)."""
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def wait_ready(self, timeout_s: float) -> None:
        """Read the child's lines until its readiness line; `timeout_s`: the longest wait for its next line.
        Waits in steps of SIGNAL_POLL_S (as `interrupts.wait_for_stop` does): a SIGTERM the kernel hands to a
        pump thread is handled only when this, the main thread, runs bytecode again, and a model load may
        keep the next line minutes away."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, min(SIGNAL_POLL_S, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() < deadline:
                    continue
                raise TimeoutError(f"{self.name} not ready after {timeout_s}s; see {self.log_path}") from None
            deadline = time.monotonic() + timeout_s
            if line is None:
                raise self.start_error(self.process.wait())
            if metrics := METRICS_BANNER.match(line):
                self.metrics_url = metrics.group(2)
            match = BANNER.match(line)
            if match:
                self.port = int(match.group(3))
                self.banner = line.strip()
                return

    def banner_value(self, key: str) -> str | None:
        """A `key=value` word of the readiness line (the model services print dtype= and fp32_linear=)."""
        match = re.search(rf"\b{re.escape(key)}=(\S+)", self.banner)
        return match.group(1) if match else None

    def start_error(self, code: int) -> ServiceStartError:
        """The service's own last line says why it exited (services print one `cannot start:` line)."""
        tail = self.log_tail()
        why = tail.splitlines()[-1].strip() if tail.strip() else f"exited with {code}"
        if not why.startswith(self.name.partition(":")[0]):
            why = f"{self.name}: {why}"
        message = f"{self.name} exited with {code}; log:\n{tail}"
        return ServiceStartError(message, f"{why} (exit {code}; log: {self.log_path})")

    def log_tail(self, lines: int = 30) -> str:
        """The last lines this start wrote (the file may hold an earlier start's of this stack, before a restart)."""
        try:
            with self.log_path.open("rb") as log_file:
                log_file.seek(self.log_start)
                text = log_file.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


class LocalStack:
    """Start with `start()` (or a `with` block); `stop()` sends SIGTERM to all and waits."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.services: dict[str, ServiceProcess] = {}
        self.stopped: dict[str, ServiceProcess] = {}  # stopped or killed, by name (to restart them)
        self._secrets_dir: Path | None = None
        self.writer_token_file: Path | None = None  # this run's verifier credential (see credentials.py)
        self.memory_namespace = config.memory_namespace or pair_namespace(config.draft_model, config.target_model)
        self.calibration: SeedResult | None = None
        self.target_dtype: str | None = None  # as the target service's banner names it, once it serves
        self._dir_lock: StackLock | None = None
        self._logged: set[str] = set()  # services whose log this stack started (a restart appends to it)

    def start(self) -> LocalStack:
        c = self.config
        with user_path():
            c.log_dir.mkdir(parents=True, exist_ok=True)
        lock = self._dir_lock = claim_log_dir(c.log_dir)  # before anything is written there
        try:
            # A fresh random writer token per run, in a private directory: only the target (the
            # verifier) and the memory service get it, so clients of the stack cannot write counts.
            remove_orphaned_secrets()
            self._secrets_dir = private_temp_dir("secrets")
            self.writer_token_file = self._secrets_dir / "writer-token"
            write_new_token(self.writer_token_file)
            memory = self._spawn("memory_service", self.memory_args(c.memory_port))
            if c.calibration_file is not None:  # before the target starts: its first snapshot holds it
                token = self.writer_token_file.read_text(encoding="utf-8").strip()
                tls = DevCerts(c.tls_dir).tls("target") if c.tls_dir else None  # the verifiers' client certificate
                self.calibration = seed_namespace(memory.address, self.memory_namespace, c.calibration_file, token, tls)
                log.info("%s", self.calibration.message)
            self._spawn("draft_service", self.draft_args())
            targets = [
                self._spawn(name, self.target_args(c.target_port + i if c.target_port else 0, memory.address))
                for i, name in enumerate(self.target_names)
            ]
            self.target_dtype = targets[0].banner_value("dtype")  # what `auto` resolved to, there
            self._spawn(
                "coordinator",
                self.coordinator_args(self.services["draft_service"].address, [t.address for t in targets]),
            )
            lock.describe(self.served())
        except BaseException:
            self.stop()
            raise
        return self

    def served(self) -> dict[str, str]:
        """What a user of the stack connects to (the lock names them to a second stack refused its directory)."""
        http = {"http": self.http_url} if self.http_url else {}
        return {name: self.services[name].address for name in ("coordinator", "memory_service")} | http

    def coordinator_args(self, draft_address: str, target_addresses: Sequence[str]) -> list[str]:
        c = self.config
        keys = ["--api-keys-file", str(c.api_keys_file)] if c.api_keys_file else []
        http = [] if c.http_port is None else ["--http-port", str(c.http_port)]
        return [
            *self.tls_args("coordinator"), *keys, *http, *self.csd_default_args(),
            "--port", str(c.coordinator_port), "--tokenizer", str(c.target_model),
            "--draft-addr", draft_address, *(arg for a in target_addresses for arg in ("--target-addr", a)),
            *([] if c.lockstep_phase is None else ["--lockstep-phase", c.lockstep_phase]),
            *([] if c.tool_call_parser is None else ["--tool-call-parser", c.tool_call_parser]),
        ]  # fmt: skip

    def draft_args(self) -> list[str]:
        c = self.config
        return [
            "--port", str(c.draft_port), "--model", str(c.draft_model), "--dtype", c.draft_dtype or c.dtype,
            "--device", c.device, *_threads_args(service_threads(c)[0]), *self.tls_args("draft"),
            *self.model_service_args(), *(["--draft-vocab", str(c.draft_vocab)] if c.draft_vocab else []),
        ]  # fmt: skip

    def target_args(self, port: int, memory_address: str) -> list[str]:
        c = self.config
        return [
            *self.tls_args("target"),
            "--port", str(port), "--model", str(c.target_model), "--dtype", c.dtype, "--device", c.device,
            *_threads_args(service_threads(c)[1]),
            "--memory-addr", memory_address, "--memory-sync-interval", str(c.memory_sync_interval_s),
            "--memory-writer-token-file", str(self.writer_token_file), "--memory-namespace", self.memory_namespace,
            *self.model_service_args(), *([] if c.meaning_guard else ["--no-meaning-guard"]),
        ]  # fmt: skip

    def default_lambda(self) -> int | None:
        """The coordinator's λ for requests that set none: the configured one; else the λ chosen for the seeded
        calibration (calibration_lambdas) where it holds: the file is in the memory (loaded now, or the namespace
        already held counts: not refused), the meaning guard is on and τ is the paper's (λ was chosen with both),
        and the target serves a dtype λ was chosen on (its banner's); else None (the coordinator's: the paper's)."""
        c = self.config
        if c.default_lambda is not None:
            return c.default_lambda
        seeded = self.calibration is not None and self.calibration.present
        return served_lambda(
            dict(c.calibration_lambdas), self.target_dtype,
            seeded=seeded, meaning_guard=c.meaning_guard, papers_tau=c.default_tau in (None, Defaults.tau),
        )  # fmt: skip

    def csd_default_args(self) -> list[str]:
        """The coordinator's server-side τ and λ, when set (λ may come with the calibration: default_lambda)."""
        tau, lam = self.config.default_tau, self.default_lambda()
        return [*([] if tau is None else ["--default-tau", str(tau)]),
                *([] if lam is None else ["--default-lambda", str(lam)])]  # fmt: skip

    def csd_defaults_message(self) -> str:
        """What a request that sets neither τ nor λ gets, and why (`up`, `demo` and `bench compare` print it)."""
        c, lam = self.config, self.default_lambda()
        tau = f"τ = {c.default_tau:g} (--default-tau)" if c.default_tau is not None else f"τ = {Defaults.tau:g}"
        if c.default_lambda is not None:
            why = "--default-lambda"
        elif lam is not None:
            why = f"chosen for the shipped calibration, {self.target_dtype} target, meaning guard: docs/calibration.md"
            if self.calibration is not None and not self.calibration.loaded:  # not loaded now: nothing tells its
                why += "; the memory is taken to hold it, as its namespace held counts before"  # counts apart (probe)
        else:
            why = "the paper's"
        return f"CSD defaults: {tau}, λ = {Defaults.lambda_ if lam is None else lam} ({why})"

    def model_service_args(self) -> list[str]:
        """What the draft and the target share: session idle TTL, batch gather time, prefix cache, riding
        prefills, float32 Linear path and int8 outlier rows (when set), the compute lock (on CPU)."""
        lock = compute_lock_path(self.config)
        ttl, gather, prefix, ride, linear, outliers = (
            self.config.session_idle_ttl_s,
            self.config.batch_gather_ms,
            self.config.prefix_cache_tokens,
            self.config.ride_prefill_tokens,
            self.config.fp32_linear,
            self.config.int8_outliers,
        )
        return [*([] if ttl is None else ["--session-idle-ttl-s", str(ttl)]),
                *([] if gather is None else ["--batch-gather-ms", str(gather)]),
                *([] if prefix is None else ["--prefix-cache-tokens", str(prefix)]),
                *([] if ride is None else ["--ride-prefill-tokens", str(ride)]),
                *([] if linear is None else ["--fp32-linear", linear]),
                *([] if outliers is None else ["--int8-outliers", outliers]),
                *([] if lock is None else ["--compute-lock", str(lock)])]  # fmt: skip

    def memory_args(self, port: int) -> list[str]:
        """Arguments of the memory service (also for restarting it on another port)."""
        c = self.config
        return [
            "--port", str(port), "--db", str(c.memory_db), "--flush-interval", str(c.memory_flush_interval_s),
            "--writer-token-file", str(self.writer_token_file), *self.tls_args("memory"),
        ]  # fmt: skip

    def tls_args(self, role: str) -> list[str]:
        """The service's certificate flags from the stack's `certs dev` directory (none: plaintext loopback)."""
        if self.config.tls_dir is None:
            return []
        certs = DevCerts(self.config.tls_dir)
        return ["--tls-cert", str(certs.cert(role)), "--tls-key", str(certs.key(role)), "--tls-ca", str(certs.ca)]

    @property
    def target_names(self) -> list[str]:
        return ["target_service", *(f"target_service:{i}" for i in range(1, self.config.target_replicas))]

    def _spawn(self, name: str, args: list[str]) -> ServiceProcess:
        c = self.config
        log_path = c.log_dir / f"{name.replace(':', '-')}.log"
        module = name.partition(":")[0]  # replicas share the module
        # stdin: a pipe this process holds and never writes; its end (this process gone, SIGKILL included)
        # drains and stops the service, so no orphan keeps the stack's ports
        cmd = [sys.executable, "-m", module, "--host", c.host, "--log-level", c.log_level, "--stop-when-stdin-closes"]
        cmd += args
        if c.metrics:
            cmd += ["--metrics-port", str(self.metrics_port(name))]
        # The stack's first start of a service moves the last run's log aside (this stack holds the
        # directory: no other writes there); a restart appends, so the crash's lines stay above the marker.
        if name not in self._logged:
            rotate_log(log_path)
            self._logged.add(name)
        marker = f"--- {name} starting {time.strftime('%Y-%m-%d %H:%M:%S')} (launcher pid {os.getpid()})\n"
        with _open_log(log_path) as log_file:
            log_file.write(marker.encode())
            log_file.flush()
            log_start = log_file.tell()
            process = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file, text=True, env=os.environ.copy(),
                start_new_session=True,  # Ctrl-C reaches us, and we stop the children in order
            )  # fmt: skip
        service = ServiceProcess(name, process, log_path, args, log_start=log_start)
        self.services[name] = service
        assert process.stdout is not None
        threading.Thread(target=service.pump, args=(process.stdout,), daemon=True, name=f"pump-{name}").start()
        service.wait_ready(c.start_timeout_s)
        log.info("%s ready on %s", name, service.address)
        return service

    def metrics_port(self, name: str) -> int:
        """Where service `name` serves /metrics: a fixed port a Prometheus configuration can name, or 0 (a free one;
        a target replica's always)."""
        base = self.config.metrics_port
        return base + METRICS_ORDER.index(name) if base and name in METRICS_ORDER else 0

    @property
    def coordinator_address(self) -> str:
        return self.services["coordinator"].address

    @property
    def memory_address(self) -> str:
        return self.services["memory_service"].address

    @property
    def http_url(self) -> str | None:
        """Base URL of the OpenAI-compatible API (`.../v1`), when the stack serves it."""
        match = HTTP_URL.search(self.services["coordinator"].banner)
        return match.group(1) if match else None

    def stop_service(self, name: str, timeout_s: float = 30.0) -> int:
        """SIGTERM one service (graceful: the memory service flushes and closes its DB); returns its exit code."""
        service = self.services.pop(name)
        self.stopped[name] = service
        if service.process.poll() is None:
            service.process.send_signal(signal.SIGTERM)
        try:
            return service.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            service.process.kill()
            return service.process.wait()
        except BaseException:  # a second Ctrl-C while it drains: it is out of `services`, so stop() would miss it
            service.process.kill()
            service.process.wait()
            raise

    def kill_service(self, name: str) -> int:
        """SIGKILL one service (a crash: nothing is flushed or closed); returns its exit code."""
        service = self.services.pop(name)
        self.stopped[name] = service
        service.process.kill()
        return service.process.wait()

    def restart_service(self, name: str, args: list[str] | None = None) -> ServiceProcess:
        """Start a stopped service again: with `args`, or as before on the same port (its peers know that address)."""
        if args is None:
            previous = self.stopped[name]
            args = list(previous.args)
            args[args.index("--port") + 1] = str(previous.port)
        return self._spawn(name, args)

    def stop(self) -> None:
        """Stop in reverse dependency order, coordinator first and memory last (also after a restart put a
        service at the end), and every service however the stopping goes: an interrupt (a second Ctrl-C)
        while one drains kills the rest rather than leave them running in their own sessions."""
        try:
            for name in sorted(self.services, key=lambda n: STOP_ORDER.index(n.partition(":")[0])):
                self.stop_service(name)
        finally:
            for name in list(self.services):
                self.kill_service(name)
            if self._secrets_dir is not None:
                shutil.rmtree(self._secrets_dir, ignore_errors=True)
                self._secrets_dir = None
            if self._dir_lock is not None:  # last: the services, stopped, write no more to the directory
                self._dir_lock.release()
                self._dir_lock = None

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

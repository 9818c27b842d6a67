"""Where the running local stack is: a small file `calispec up` writes and removes, read by the other commands.

`calispec memory ...` and `calispec calibrate` default to the running stack's memory service,
namespace, model pair and writer token (the file names the token file, never the token), so a
user never has to copy a namespace by hand. The file is private (0600) and ignored once its
process is gone (a crashed `calispec up` leaves a stale file behind); the process's start time, where
/proc has it, tells a live `calispec up` from another process that was given its pid since.
`calispec down` stops the stack it names.

One `calispec up` runs per user: it holds `stack.lock` beside the file for as long as it runs, and a
second one is refused (`StackLock`; a local stack holds the same kind of lock on its log directory).
`calispec down` also stops an `up` that holds the lock but is still starting (no state file yet).

Secrets (a stack's writer token, `up`'s API keys and certificates) live in private temporary directories named by
their process's pid (`private_temp_dir`): a process killed by SIGKILL cannot remove its own, so each stack that
starts removes those of processes that are gone (`remove_orphaned_secrets`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import TracebackType
from typing import Any

import platformdirs

from calispec_core.holder_lock import HeldElsewhere, HolderFile, read_record

_kill = os.kill  # stop_stack's signal (the tests replace it, not os.kill)


def _endpoint(address: str) -> tuple[str, str]:
    """(host, port) of a `host:port` address, the host lower-cased and unbracketed, `localhost` as 127.0.0.1."""
    host, _, port = address.strip().rpartition(":")
    host = host.strip("[]").lower()
    return ("127.0.0.1" if host == "localhost" else host), port


def state_path() -> Path:
    return Path(platformdirs.user_data_dir("calispec")) / "stack.json"


OPTIONAL_KEYS = {"tls_dir": "", "device": "auto"}  # written only where they differ from these (StackState.write)


@dataclass(frozen=True)
class StackState:
    pid: int
    coordinator: str
    memory: str
    namespace: str
    draft: str
    target: str
    writer_token_file: str
    started: int = 0  # the process's start time in clock ticks after boot (/proc); 0: unknown
    dtype: str = "auto"  # the target's --dtype as `up` was given it, and the draft's as served (calibrate's defaults)
    draft_dtype: str = "auto"
    tls_dir: str = ""  # `up --tls`'s certificates: the memory tools' default client certificates; "": plaintext
    device: str = "auto"  # the model services' --device as `up` was given it (calibrate's default)

    def serves_memory_at(self, address: str) -> bool:
        """Whether `address` names this stack's memory service: the same host and port, `localhost` standing for
        the loopback address the stack bound (found by probing: `--memory-addr localhost:P` for the stack's
        127.0.0.1:P lost the stack's namespace and writer token)."""
        return _endpoint(address) == _endpoint(self.memory)

    def write(self, path: Path | None = None) -> Path:
        path = path or state_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.touch(mode=0o600, exist_ok=True)
        tmp.chmod(0o600)
        # newer keys only where set (tls_dir: wave 55's, device: wave 58's), so a wave-54 CLI reads the rest
        recorded = {k: v for k, v in asdict(self).items() if k not in OPTIONAL_KEYS or v != OPTIONAL_KEYS[k]}
        tmp.write_text(json.dumps(recorded, indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path


def running_stack(path: Path | None = None) -> StackState | None:
    """The state of a live `calispec up`, or None (no file, unreadable, or its process has exited)."""
    path = path or state_path()
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
        known = {f.name for f in fields(StackState)}  # a newer release's keys too: its stack is still the one running
        state = StackState(**{k: v for k, v in recorded.items() if k in known})
    except (OSError, ValueError, TypeError, AttributeError):  # AttributeError: JSON that is not an object
        return None
    return state if _alive(state.pid, state.started) else None


def coordinator_address(given: str | None, fallback: str) -> str:
    """--address, else the running `calispec up`'s coordinator (started on other ports, `generate` dialled 50050),
    else `fallback`."""
    stack = None if given else running_stack()
    return given or (stack.coordinator if stack else fallback)


def stop_stack(timeout_s: float, path: Path | None = None) -> StackState | Holder | None:
    """SIGTERM the running `calispec up` (it stops its services in order, then removes the file; one still
    starting stops what it started) and wait for it to exit; the stopped stack's state (its lock's holder while
    it starts), or None when none runs. TimeoutError if it outlives `timeout_s`."""
    state = running_stack(path) or starting_stack(path)
    if state is None:
        return None
    try:
        _kill(state.pid, signal.SIGTERM)
    except ProcessLookupError:  # it exited since (Ctrl-C there, another `down`)
        return state
    except PermissionError:
        raise PermissionError(f"`calispec up` (pid {state.pid}) belongs to another user") from None
    deadline = time.monotonic() + timeout_s
    while _alive(state.pid, state.started):  # not our child: no wait(); poll its pid
        if time.monotonic() > deadline:
            raise TimeoutError(f"`calispec up` (pid {state.pid}) still runs after {timeout_s:g} s")
        time.sleep(0.1)
    return state


def clear_state(pid: int, path: Path | None = None) -> None:
    """Remove the file if it is this process's (a second stack may have replaced it)."""
    path = path or state_path()
    try:
        if json.loads(path.read_text(encoding="utf-8")).get("pid") == pid:
            path.unlink()
    except (OSError, ValueError):
        pass


def process_start_time(pid: int) -> int:
    """The process's start time in clock ticks after boot (0 where /proc cannot say; -1 for a zombie)."""
    try:
        # after the name in (), which may hold spaces, ")" and bytes cut mid-character: state, ..., starttime
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        return -1 if fields[0] == b"Z" else int(fields[19])
    except (OSError, ValueError, IndexError):
        return 0


def _alive(pid: int, started: int = 0) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    now = process_start_time(pid)
    return now != -1 and (not started or now in (0, started))


LOCK_NAME = "stack.lock"
_PRIVATE_DIR = re.compile(r"calispec-(?:up|secrets)-(\d+)-")  # private_temp_dir's names


def private_temp_dir(kind: str) -> Path:
    """A new 0700 directory for this process's secrets (`kind`: "up" or "secrets"), named by its pid."""
    return Path(tempfile.mkdtemp(prefix=f"calispec-{kind}-{os.getpid()}-"))


def remove_orphaned_secrets(root: Path | None = None) -> list[Path]:
    """Remove this user's private_temp_dir directories whose process is gone; returns them. A SIGKILLed `calispec
    up` left its writer token and API keys in /tmp for good (found by probing). A pid given to another process
    since keeps its directory until a later start: never a live process's."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob("calispec-*-*-*"):
        match = _PRIVATE_DIR.match(path.name)
        try:
            ours = match is not None and path.lstat().st_uid == os.getuid() and path.is_dir() and not path.is_symlink()
        except OSError:
            continue
        if ours and not _alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


@dataclass(frozen=True)
class Holder:
    """Who holds a `StackLock`: its process (pid and start time, as in StackState) and, once it serves, its
    addresses (service name -> address or URL)."""

    pid: int
    started: int = 0
    addresses: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        served = ", ".join(f"{name} {address}" for name, address in self.addresses.items())
        return f"pid {self.pid}: {served}" if served else f"pid {self.pid}, still starting"


class StackBusy(RuntimeError):
    """A live stack holds the lock; `holder`: who (None where its file could not be read)."""

    def __init__(self, path: Path, holder: Holder | None) -> None:
        super().__init__(f"{path} is held by a running stack ({holder or 'pid unknown'})")
        self.holder = holder


class StackLock:
    """An exclusive `flock` on a file that names its holder (calispec_core/holder_lock.py): one stack per log
    directory, one `calispec up` per user. A crashed stack's lock is simply taken over (its file stays, naming a
    dead pid). Not inherited by the services."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: HolderFile | None = None

    def acquire(self) -> StackLock:
        """Take the lock at once, or raise StackBusy naming the live holder (OSError: the path is unusable)."""
        try:
            self._file = HolderFile.take(self.path)
        except HeldElsewhere as held:
            raise StackBusy(self.path, _holder(held.record)) from None
        self.describe({})
        return self

    def describe(self, addresses: dict[str, str]) -> None:
        """Name this process, and what it serves, for whoever finds the lock taken (or `calispec down`)."""
        assert self._file is not None, "describe() needs the lock"
        me = os.getpid()
        self._file.write(asdict(Holder(me, process_start_time(me), addresses)))

    def release(self) -> None:
        """Empty the file (a live pid in it would still look like a holder) and drop the lock."""
        if self._file is not None:
            self._file.release()
            self._file = None

    def __enter__(self) -> StackLock:
        return self if self._file is not None else self.acquire()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def lock_path(path: Path | None = None) -> Path:
    """`calispec up`'s lock, beside its state file."""
    return (path or state_path()).with_name(LOCK_NAME)


def claim_up(path: Path | None = None) -> StackLock:
    """`calispec up`'s lock, taken (StackBusy while another live `up` holds it): release it when the stack ends."""
    lock = lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    return StackLock(lock).acquire()


def starting_stack(path: Path | None = None) -> Holder | None:
    """The live `calispec up` that holds the lock, from its file (None: none holds it, or it crashed)."""
    try:
        fd = os.open(lock_path(path), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        holder = _holder(read_record(fd))
    finally:
        os.close(fd)
    return holder if holder is not None and _alive(holder.pid, holder.started) else None


def _holder(record: dict[str, Any] | None) -> Holder | None:
    try:
        return Holder(**record) if record is not None else None
    except TypeError:
        return None

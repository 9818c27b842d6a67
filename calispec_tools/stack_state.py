"""Where the running local stack is: a small file `calispec up` writes and removes, read by the other commands.

`calispec memory ...` and `calispec calibrate` default to the running stack's memory service,
namespace, model pair and writer token (the file names the token file, never the token), so a
user never has to copy a namespace by hand. The file is private (0600) and ignored once its
process is gone (a crashed `calispec up` leaves a stale file behind); the process's start time, where
/proc has it, tells a live `calispec up` from another process that was given its pid since.
`calispec down` stops the stack it names.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import platformdirs

_kill = os.kill  # stop_stack's signal (the tests replace it, not os.kill)


def state_path() -> Path:
    return Path(platformdirs.user_data_dir("calispec")) / "stack.json"


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

    def write(self, path: Path | None = None) -> Path:
        path = path or state_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.touch(mode=0o600, exist_ok=True)
        tmp.chmod(0o600)
        tmp.write_text(json.dumps(asdict(self), indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path


def running_stack(path: Path | None = None) -> StackState | None:
    """The state of a live `calispec up`, or None (no file, unreadable, or its process has exited)."""
    path = path or state_path()
    try:
        state = StackState(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None
    return state if _alive(state.pid, state.started) else None


def stop_stack(timeout_s: float, path: Path | None = None) -> StackState | None:
    """SIGTERM the running `calispec up` (it stops its services in order, then removes the file) and wait
    for it to exit; the stopped stack's state, or None when none runs. TimeoutError if it outlives `timeout_s`."""
    state = running_stack(path)
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

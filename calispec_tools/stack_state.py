"""Where the running local stack is: a small file `calispec up` writes and removes, read by the other commands.

`calispec memory ...` and `calispec calibrate` default to the running stack's memory service,
namespace, model pair and writer token (the file names the token file, never the token), so a
user never has to copy a namespace by hand. The file is private (0600) and ignored once its
process is gone (a crashed `calispec up` leaves a stale file behind).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import platformdirs


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
    return state if _alive(state.pid) else None


def clear_state(pid: int, path: Path | None = None) -> None:
    """Remove the file if it is this process's (a second stack may have replaced it)."""
    path = path or state_path()
    try:
        if json.loads(path.read_text(encoding="utf-8")).get("pid") == pid:
            path.unlink()
    except (OSError, ValueError):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

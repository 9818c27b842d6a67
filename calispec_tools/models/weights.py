"""Writing a model directory the way every other file is written: readable as the umask allows."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def save_model(model: Any, out_dir: Path) -> None:
    """`model.save_pretrained(out_dir)`, its weight files then given the mode a plain file gets (0644 under the
    usual umask 022). safetensors writes them 0600 (a temporary file renamed), so a pair pulled by one account
    could not be loaded by another (a service user, a Ray worker on a shared volume) though its config and
    tokenizer could."""
    model.save_pretrained(str(out_dir))
    mode = 0o666 & ~current_umask()
    for path in Path(out_dir).glob("*.safetensors"):
        path.chmod(mode)


def current_umask() -> int:
    """Read from /proc (Linux): os.umask can only read it by setting it, for every thread of the process."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask

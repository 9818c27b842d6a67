"""How much more memory this process may take: the host's MemAvailable, capped by its cgroup's headroom.

A pod's cgroup limit (Kubernetes `resources.limits.memory`) is invisible in /proc/meminfo, which shows the
node; going past it gets the process OOM-killed, so both are read and the smaller wins.
"""

from __future__ import annotations

from pathlib import Path

UNLIMITED = 1 << 60  # cgroup v1 reports "no limit" as a huge page-rounded number
GIB = 2**30
# Below this much available, the page cache (the libraries' code, the model files) is evicted and every forward slows:
# a float32 stack beside a second float32 pair left 1.2 GiB of 23.6 and ran its sd 1.4-1.9x slower (wave 47).
LOW_MEMORY = 2 * GIB


def available_bytes(root: Path = Path("/")) -> int | None:
    """Bytes this process may still allocate, or None where neither source is readable (not Linux)."""
    known = [b for b in (_meminfo_available(root), _cgroup_headroom(root)) if b is not None]
    return min(known) if known else None


def _meminfo_available(root: Path) -> int | None:
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_headroom(root: Path) -> int | None:
    """limit - usage of this process's memory cgroup (v2, else v1); None where unlimited or unreadable."""
    for limit_file, usage_file in (
        ("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory.current"),
        ("sys/fs/cgroup/memory/memory.limit_in_bytes", "sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit_text = (root / limit_file).read_text().strip()
            usage = int((root / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit_text == "max" or int(limit_text) >= UNLIMITED:
            return None
        return max(int(limit_text) - usage, 0)
    return None

"""calispec_core/host_memory.py: MemAvailable capped by the cgroup's headroom, read from a fake root."""

from __future__ import annotations

from pathlib import Path

from calispec_core.host_memory import available_bytes

GIB = 2**30


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def meminfo(root: Path, available_kb: int) -> None:
    write(root, "proc/meminfo", f"MemTotal:       99999999 kB\nMemAvailable:   {available_kb} kB\n")


def test_the_hosts_available_memory_without_a_cgroup_limit(tmp_path: Path) -> None:
    meminfo(tmp_path, 16 * 1024 * 1024)
    assert available_bytes(tmp_path) == 16 * GIB
    write(tmp_path, "sys/fs/cgroup/memory.max", "max\n")  # cgroup v2 without a limit
    write(tmp_path, "sys/fs/cgroup/memory.current", str(3 * GIB))
    assert available_bytes(tmp_path) == 16 * GIB


def test_a_pods_limit_caps_what_the_node_has_free(tmp_path: Path) -> None:
    meminfo(tmp_path, 100 * 1024 * 1024)
    write(tmp_path, "sys/fs/cgroup/memory.max", str(12 * GIB))
    write(tmp_path, "sys/fs/cgroup/memory.current", str(7 * GIB))
    assert available_bytes(tmp_path) == 5 * GIB


def test_cgroup_v1_limits_and_its_unlimited_marker(tmp_path: Path) -> None:
    meminfo(tmp_path, 100 * 1024 * 1024)
    write(tmp_path, "sys/fs/cgroup/memory/memory.limit_in_bytes", str(9223372036854771712))  # v1: no limit
    write(tmp_path, "sys/fs/cgroup/memory/memory.usage_in_bytes", str(GIB))
    assert available_bytes(tmp_path) == 100 * GIB
    write(tmp_path, "sys/fs/cgroup/memory/memory.limit_in_bytes", str(4 * GIB))
    assert available_bytes(tmp_path) == 3 * GIB


def test_nothing_readable_is_unknown(tmp_path: Path) -> None:
    assert available_bytes(tmp_path) is None
    write(tmp_path, "proc/meminfo", "garbage\n")
    assert available_bytes(tmp_path) is None

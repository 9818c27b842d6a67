"""The coordinator's fixed glibc malloc thresholds (calispec_core/malloc_thresholds.py)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

# In a process of its own: a freed 2 MB mmapped block raises glibc's mmap threshold past 1 MB unless the thresholds
# are fixed; then prints whether a 1 MB block was mmapped (1) or taken from an arena (0), as glibc's mallinfo2 counts.
PROBE = """
import ctypes, sys
from calispec_core.malloc_thresholds import fix_malloc_thresholds
libc = ctypes.CDLL(None)
names = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in names]
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
if sys.argv[1] == "fixed":
    assert fix_malloc_thresholds()
libc.free(libc.malloc(2 << 20))
before = libc.mallinfo2().hblks
block = libc.malloc(1 << 20)
print(libc.mallinfo2().hblks - before)
libc.free(block)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")
@pytest.mark.parametrize(("mode", "mmapped"), [("fixed", "1"), ("dynamic", "0")])
def test_fixed_thresholds_keep_glibc_from_raising_them(mode: str, mmapped: str) -> None:
    """Unfixed, glibc raised the threshold after a freed 1.84 MB block and the coordinator's per-thread arenas kept
    up to 3.67 MB free each (wave 58); fixed, a 1 MB block is still mmapped after a freed 2 MB one."""
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == mmapped


def test_the_coordinator_fixes_them_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    import calispec_core.malloc_thresholds as thresholds
    from coordinator import __main__ as coordinator_cli

    calls: list[str] = []

    def parse_config(argv: object) -> None:
        calls.append("parsed")
        raise SystemExit(0)

    monkeypatch.setattr(thresholds, "fix_malloc_thresholds", lambda: calls.append("fixed") or True)
    monkeypatch.setattr(coordinator_cli, "parse_config", parse_config)
    with pytest.raises(SystemExit):
        coordinator_cli.main([])
    assert calls == ["fixed", "parsed"]

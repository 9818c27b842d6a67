"""Exact scoring: numbers extracted from math answers; code run against its unit tests in a sandbox.

The sandbox is a fresh `python -I` in a temporary directory with CPU, memory, file-size and
process limits (setrlimit in the child), killed as a process group at the timeout, and with no
network when `unshare -rn` works here (a user + network namespace; else it runs without that
layer and says so in the result).
"""

from __future__ import annotations

import functools
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from calispec_tools.eval.tasks import Task

NUMBER = r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+"
_FINAL_PATTERNS = (  # the most explicit statement of an answer wins over the last number in the text
    re.compile(r"\\boxed\{\s*\$?(" + NUMBER + r")"),
    re.compile(r"####\s*\$?(" + NUMBER + r")"),
    re.compile(r"answer\s*(?:is|:|=)\s*\$?\s*(" + NUMBER + r")", re.IGNORECASE),
)
_ANY_NUMBER = re.compile(NUMBER)


def _to_float(text: str) -> float | None:
    try:
        return float(text.replace(",", "").rstrip("."))
    except ValueError:
        return None


def extract_final_number(text: str) -> float | None:
    """The answer a text commits to: \\boxed{}, '####', 'answer is', else its last number."""
    for pattern in _FINAL_PATTERNS:
        found = pattern.findall(text)
        if found:
            return _to_float(found[-1])
    numbers = _ANY_NUMBER.findall(text)
    return _to_float(numbers[-1]) if numbers else None


def score_math(output: str, answer: float, rel_tol: float = 1e-6) -> bool:
    value = extract_final_number(output)
    return value is not None and math.isclose(value, answer, rel_tol=rel_tol, abs_tol=1e-9)


_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.DOTALL)


def build_program(task: Task, output: str) -> str:
    """The code to test: a fenced block that defines the function stands alone; else prompt + completion."""
    fenced = _FENCE.findall(output)
    if fenced:
        block = fenced[0]
        body = block if f"def {task.entry_point}" in block else task.prompt + block
    else:
        body = task.prompt + output
    return f"{body}\n\n{task.tests}\n"


@dataclass(frozen=True)
class CodeResult:
    passed: bool
    status: str  # "passed", "failed", "timeout"
    detail: str = ""  # the tail of stderr on failure
    network_isolated: bool = False


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0
    memory_bytes: int = 1 << 30  # address space; enough for CPython, not for runaway allocations
    file_bytes: int = 1 << 20
    processes: int = 64  # per-user cap inside the child: a fork bomb fails fast


DEFAULT_LIMITS = SandboxLimits()


@functools.cache
def network_namespace_available() -> bool:
    """True when `unshare -rn` can run a command here (unprivileged user namespaces allowed)."""
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        return subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# Limits are set by the child itself before it runs the solution: no preexec_fn, which is unsafe
# in a parent with threads (gRPC's). argv: cpu_s, address-space bytes, file bytes, processes, path.
_BOOT = """
import os, resource, runpy, sys
cpu, mem, fsize, nproc = (int(v) for v in sys.argv[1:5])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if os.getuid() != 0:  # root ignores RLIMIT_NPROC (and it counts all of a user's processes)
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
path = sys.argv[5]
sys.argv = [path]
runpy.run_path(path, run_name="__main__")
"""
_SIGXCPU_CODES = (-signal.SIGXCPU, 128 + signal.SIGXCPU)  # CPU limit hit: the same verdict as a timeout


def _command(path: Path, limits: SandboxLimits, isolated: bool) -> list[str]:
    cpu = math.ceil(limits.timeout_s) + 1  # wall-clock timeout normally fires first
    args = [str(cpu), str(limits.memory_bytes), str(limits.file_bytes), str(limits.processes), str(path)]
    cmd = [sys.executable, "-I", "-B", "-c", _BOOT, *args]
    return ["unshare", "-rn", *cmd] if isolated else cmd


def run_program(program: str, limits: SandboxLimits = DEFAULT_LIMITS) -> CodeResult:
    isolated = network_namespace_available()
    with tempfile.TemporaryDirectory(prefix="calispec-eval-") as tmp:
        path = Path(tmp) / "solution.py"
        path.write_text(program, encoding="utf-8")
        proc = subprocess.Popen(
            _command(path, limits, isolated), cwd=tmp,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp},
            start_new_session=True,
        )  # fmt: skip
        try:
            _, err = proc.communicate(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group: the test may have spawned children
            proc.communicate()
            return CodeResult(False, "timeout", f"killed after {limits.timeout_s}s", isolated)
    if proc.returncode == 0:
        return CodeResult(True, "passed", "", isolated)
    if proc.returncode in _SIGXCPU_CODES:
        return CodeResult(False, "timeout", "CPU time limit", isolated)
    tail = err.decode(errors="replace").strip().splitlines()[-3:]
    return CodeResult(False, "failed", "\n".join(tail), isolated)


def score_code(task: Task, output: str, limits: SandboxLimits = DEFAULT_LIMITS) -> CodeResult:
    return run_program(build_program(task, output), limits)


def score(task: Task, output: str, limits: SandboxLimits = DEFAULT_LIMITS) -> tuple[bool, str]:
    """(correct, status) for any task kind."""
    if task.kind == "code":
        result = score_code(task, output, limits)
        return result.passed, result.status
    assert task.answer is not None
    ok = score_math(output, task.answer)
    return ok, "correct" if ok else "wrong"

"""The host compute lock: the model services of one CPU host take turns computing."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from unittest.mock import patch

import pytest

from calispec_core import host_lock
from calispec_core.compute import ComputeThread
from calispec_core.host_lock import HostComputeLock
from calispec_tools.stack import LocalStack, StackConfig, compute_lock_path, service_threads, split_cores
from tests.conftest import TinyPair
from tests.helpers import wait_until

HOLDER = """
import sys
from calispec_core.host_lock import HostComputeLock
lock = HostComputeLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin (or kills us)
"""


def _holder(path: Path) -> subprocess.Popen[str]:
    """Another process holding the lock on `path` (as the other model service would)."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_a_lock_held_by_another_process_excludes_this_one_until_it_lets_go(tmp_path: Path) -> None:
    lock = HostComputeLock(tmp_path / "compute.lock")
    child = _holder(lock.path)
    assert not lock.acquire(blocking=False)
    assert child.stdin is not None
    child.stdin.close()  # the holder ends: its lock goes with it
    assert lock.acquire()  # waits for that, however long it takes
    assert child.wait(timeout=60) == 0
    lock.release()
    lock.close()


def test_a_holder_that_dies_never_blocks_the_other_service(tmp_path: Path) -> None:
    lock = HostComputeLock(tmp_path / "compute.lock")
    child = _holder(lock.path)
    child.kill()  # a crashed service: the kernel drops its lock
    child.wait(timeout=60)
    assert lock.acquire()
    lock.release()
    lock.close()


def test_a_holder_that_hangs_is_waited_for_once_then_jobs_run_without_the_lock_until_it_is_free(
    tmp_path: Path,
) -> None:
    """A draft frozen mid-forward (SIGSTOP) held the lock, and every target forward waited for it, `ar` requests
    too, until their 504 (found by probing). Now a job waits a bounded time once, and later jobs do not wait while
    the holder keeps it; once it lets go, jobs take turns again."""
    compute = ComputeThread("test-compute")
    lock = compute.host_lock = HostComputeLock(tmp_path / "compute.lock")
    child = _holder(lock.path)  # a frozen holder: it never lets go by itself
    pool = ThreadPoolExecutor(1)
    try:
        with patch.object(host_lock, "MAX_WAIT_S", 0.05):
            assert pool.submit(compute.run, lambda: "computed").result(timeout=60) == "computed"
        with patch.object(host_lock, "MAX_WAIT_S", 1e9):  # while it is stuck, no job waits again
            assert pool.submit(compute.run, lambda: "again").result(timeout=60) == "again"
    finally:
        assert child.stdin is not None
        child.stdin.close()  # the holder lets go
        child.wait(timeout=60)
        pool.shutdown()
    other = HostComputeLock(lock.path)

    def held_by_the_job() -> bool:
        free = other.acquire(blocking=False)
        if free:
            other.release()
        return not free

    wait_until(lambda: compute.run(held_by_the_job))  # the two services take turns again
    other.close()
    compute.use_host_lock(None)


def test_a_waiter_whose_flock_fails_leaves_the_lock_usable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A blocking flock that failed in the waiter thread (ENOLCK on a network file system) left it marked as
    waiting for good: no job ever took the lock again (found by the review)."""
    lock = HostComputeLock(tmp_path / "compute.lock")
    child = _holder(lock.path)
    real_flock = host_lock.fcntl.flock

    def flock(fd: int, operation: int) -> None:
        if operation == host_lock.fcntl.LOCK_EX:  # the waiter's blocking call only
            raise OSError(errno.ENOLCK, "No locks available")
        real_flock(fd, operation)

    monkeypatch.setattr(host_lock.fcntl, "flock", flock)
    try:
        assert lock.acquire_within(0.5) is False
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=60)
    monkeypatch.setattr(host_lock.fcntl, "flock", real_flock)
    assert lock.acquire_within(0.5)  # the holder is gone: taken again
    lock.release()
    lock.close()


def test_every_job_on_the_compute_thread_holds_the_lock_and_nested_calls_keep_it(tmp_path: Path) -> None:
    compute = ComputeThread("test-compute")
    compute.host_lock = HostComputeLock(tmp_path / "compute.lock")
    other = HostComputeLock(tmp_path / "compute.lock")  # as another process would see it (a separate flock)

    def inner() -> bool:
        return other.acquire(blocking=False)

    def job() -> tuple[bool, bool]:
        nested = compute.run(inner)  # already on the thread: runs directly, no second acquire or early release
        return nested, other.acquire(blocking=False)

    assert compute.run(job) == (False, False)  # held throughout the job
    assert other.acquire(blocking=False)  # and released after it
    other.release()
    other.close()
    compute.use_host_lock(None)


def test_a_cpu_stack_gives_both_model_services_one_lock_and_all_cores(tiny_pair: TinyPair, tmp_path: Path) -> None:
    base = StackConfig(tiny_pair.draft, tiny_pair.target, tmp_path / "m.db", tmp_path, device="cpu")
    stack = LocalStack(base)
    locks = [args[args.index("--compute-lock") + 1] for args in (stack.draft_args(), stack.target_args(0, "x:1"))]
    assert locks == [str(tmp_path / "compute.lock")] * 2
    assert service_threads(base) == (None, None)  # they take turns: each may use every core
    apart = replace(base, compute_lock=False)  # --no-compute-lock: both at once, on split cores
    assert compute_lock_path(apart) is None and "--compute-lock" not in LocalStack(apart).draft_args()
    assert service_threads(apart) == split_cores(os.cpu_count() or 1)
    assert compute_lock_path(replace(base, device="cuda")) is None  # on a GPU they compute apart


def test_both_model_services_take_the_compute_lock_flag(tmp_path: Path) -> None:
    from draft_service.__main__ import parse_config as draft_config
    from target_service.__main__ import parse_config as target_config

    for parse in (draft_config, target_config):
        assert parse(["--model", "m"])[0].model.compute_lock is None
        config = parse(["--model", "m", "--compute-lock", str(tmp_path / "c.lock")])[0]
        assert config.model.compute_lock == tmp_path / "c.lock"
        with pytest.raises(SystemExit):  # a usage error at start-up, not a failure at the first forward
            parse(["--model", "m", "--compute-lock", str(tmp_path / "missing" / "c.lock")])
        with pytest.raises(SystemExit):  # it failed the start blaming the model: "Is a directory"
            parse(["--model", "m", "--compute-lock", str(tmp_path)])


def test_a_runner_given_a_compute_lock_puts_every_later_job_under_it(tiny_pair: TinyPair, tmp_path: Path) -> None:
    from calispec_core.compute import compute_thread
    from calispec_core.modeling import ModelRunner, ModelSpec

    try:
        ModelRunner(ModelSpec(tiny_pair.draft, device="cpu", compute_lock=tmp_path / "c.lock"))
        lock = compute_thread().host_lock
        assert lock is not None and lock.path == tmp_path / "c.lock"
    finally:
        compute_thread().use_host_lock(None)  # the process's compute thread is shared by the other tests
    assert lock.closed  # replaced locks are closed, not leaked


def test_a_runner_without_a_compute_lock_lifts_the_one_before(tiny_pair: TinyPair, tmp_path: Path) -> None:
    """The last runner's spec decides: before, a runner without a lock left an earlier runner's lock on
    every job of the process (and a second lock leaked the first's descriptor)."""
    from calispec_core.compute import compute_thread
    from calispec_core.modeling import ModelRunner, ModelSpec

    ModelRunner(ModelSpec(tiny_pair.draft, device="cpu", compute_lock=tmp_path / "first.lock"))
    first = compute_thread().host_lock
    ModelRunner(ModelSpec(tiny_pair.draft, device="cpu", compute_lock=tmp_path / "second.lock"))
    assert first is not None and first.closed
    second = compute_thread().host_lock
    ModelRunner(ModelSpec(tiny_pair.draft, device="cpu"))
    assert compute_thread().host_lock is None and second is not None and second.closed


def test_a_job_cannot_replace_the_lock_it_holds(tmp_path: Path) -> None:
    compute = ComputeThread("test-compute")
    with pytest.raises(RuntimeError):
        compute.run(compute.use_host_lock, tmp_path / "c.lock")


def test_a_model_path_that_is_a_file_is_named_so(tmp_path: Path) -> None:
    """`--model FILE` said "model directory not found: FILE" of a file that is there."""
    from calispec_core.errors import InvalidArgument
    from calispec_core.modeling import ModelRunner, ModelSpec

    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(InvalidArgument, match=r"model path is not a directory: .*model\.safetensors"):
        ModelRunner(ModelSpec(tmp_path / "model.safetensors", device="cpu"))

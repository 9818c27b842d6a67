"""`calispec calibrate --ray`: a local Ray cluster in a network namespace the test makes (loopback only), and how a
worker's failure reads on the driver."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TinyPair
from tests.e2e.netns import can_unshare, run_scenario

SCENARIO = Path(__file__).with_name("calibrate_ray_scenario.py")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not can_unshare(), reason="needs `unshare -n` (root or user namespaces) and `ip`")
def test_calibrate_on_ray_writes_through_the_memory_service(tiny_pair: TinyPair) -> None:
    pytest.importorskip("ray", reason="`make test-slow` installs the ray extra")
    result = run_scenario(SCENARIO, [str(tiny_pair.draft), str(tiny_pair.target)], prefix="cc-")
    assert result["events"] > 0 and len(result["workers"]) == 2


class _Unpicklable(Exception):
    def __init__(self) -> None:
        super().__init__("holds a lock")
        self.lock = threading.Lock()  # as grpc's RpcError holds its call's state


@pytest.mark.slow
def test_a_workers_failure_reads_as_one_line_whatever_ray_wraps_it_in() -> None:
    """Ray's reports span a traceback; the driver's error line must name the worker's exception in one line."""
    exceptions = pytest.importorskip("ray.exceptions", reason="`make test-slow` installs the ray extra")
    from calispec_tools.calibrate.ray_job import REASON_CHARS, failure_reason

    def task_error(cause: BaseException, last_line: str) -> Any:
        trace = f'Traceback (most recent call last):\n  File "w.py", line 1, in run\n{last_line}'
        return exceptions.RayTaskError("run", trace, cause, proctitle="ray::Worker", pid=1, ip="127.0.0.1")

    raised = task_error(ValueError("a bad row\nover two lines"), "ValueError: a bad row")
    assert failure_reason(raised) == "ValueError: a bad row over two lines"
    in_init = exceptions.ActorDiedError(task_error(OSError("no model dir"), "OSError: no model dir"))
    assert failure_reason(in_init) == "OSError: no model dir"
    unpicklable = task_error(_Unpicklable(), "tests._Unpicklable: holds a lock\n\tstatus = 7\n>")
    assert failure_reason(unpicklable) == "tests._Unpicklable: holds a lock status = 7 >"  # no `ray::` title
    assert len(failure_reason(task_error(ValueError("x" * 5000), "ValueError"))) == REASON_CHARS
    unavailable = exceptions.ActorUnavailableError("the actor is restarting", None)
    assert "\n" not in (reason := failure_reason(unavailable)) and "the actor is restarting" in reason


@pytest.mark.slow
def test_a_jobs_repr_leaves_its_secrets_out() -> None:
    """A job is logged or shown in errors: the writer token and the certificate's private key stay out of it."""
    pytest.importorskip("ray", reason="`make test-slow` installs the ray extra")
    from calispec_tools.calibrate.ray_job import RayJob

    pems = {"cert": "CERT", "key": "-----BEGIN PRIVATE KEY----- secret", "ca": "CA"}
    job = RayJob("d", "t", "auto", "cpu", "127.0.0.1:1", "ns", "writer-token-secret", tls=pems)
    assert "secret" not in repr(job) and job.tls == pems and job.token == "writer-token-secret"

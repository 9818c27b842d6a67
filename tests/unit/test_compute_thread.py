"""All torch compute of a process runs on one thread (calispec_core/compute.py says why)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from calispec_core.batch_forward import forward_rows
from calispec_core.compute import ComputeThread, compute_thread
from calispec_core.modeling import ModelRunner, ModelSpec, prefill_session
from calispec_core.openmp import SERVICE_SPIN_COUNT
from calispec_core.prefix_cache import PrefixCache
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Stopwatch
from draft_service import proposer as proposer_module
from draft_service.proposer import Proposer


def test_loading_and_forwards_from_any_thread_run_on_the_compute_thread(tiny_pair) -> None:
    runner = ModelRunner(ModelSpec(tiny_pair.target, "float32", "cpu"))
    threads: list[int] = []
    # the embedding: every pass calls it (HF's, and the lean one that does not call the model itself)
    runner.model.get_input_embeddings().register_forward_pre_hook(lambda *_: threads.append(threading.get_ident()))
    session = prefill_session(runner, "s", [5, 6, 7])
    with ThreadPoolExecutor(4) as pool:  # like gRPC handler threads
        list(pool.map(lambda _: runner.forward(session.pending(), session.cache, 1), range(1)))
        list(pool.map(lambda i: prefill_session(runner, f"p{i}", [3, 4, 5 + i]), range(4)))
    assert threads and set(threads) == {compute_thread().ident}
    assert compute_thread().ident != threading.get_ident()


def test_prefix_cache_copies_run_on_the_compute_thread(target_runner: ModelRunner, monkeypatch) -> None:
    """Storing and attaching copy KV tensors (large copies run parallel regions): never on a handler thread."""
    cache = PrefixCache(1024)
    seen: list[tuple[str, int]] = []
    for name in ("attach", "store"):
        real = getattr(cache, name)
        monkeypatch.setattr(
            cache, name, lambda *a, _n=name, _r=real: seen.append((_n, threading.get_ident())) or _r(*a)
        )
    prompt = list(range(3, 40))
    with ThreadPoolExecutor(1) as pool:  # a gRPC handler thread; one after the other, so the second hits
        list(pool.map(lambda i: prefill_session(target_runner, f"pc{i}", prompt, cache), range(2)))
    assert {name for name, _ in seen} == {"attach", "store"} and cache.stats.hits >= 1
    assert {ident for _, ident in seen} == {compute_thread().ident}


def test_a_draft_step_runs_on_the_compute_thread(draft_runner: ModelRunner, monkeypatch) -> None:
    proposer = Proposer(draft_runner, max_sessions=2)
    seen: list[int] = []

    def recording(*args):  # the step's own call, before any forward hands off
        seen.append(threading.get_ident())
        return forward_rows(*args)

    monkeypatch.setattr(proposer_module, "forward_rows", recording)
    proposer.prefill("s", [1, 2, 3], SamplingConfig(), Stopwatch())
    proposer.propose("s", 3, None, [], Stopwatch())
    proposer.stop()
    assert seen and set(seen) == {compute_thread().ident}  # one call per drafted token


def test_calls_from_the_compute_thread_run_directly_and_errors_reach_the_caller() -> None:
    compute = ComputeThread()
    assert compute.run(lambda: compute.run(threading.get_ident)) == compute.ident  # no deadlock on itself

    def fail() -> None:
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        compute.run(fail)
    assert compute.run(lambda: 7) == 7  # still serving after an error


def test_model_services_limit_openmp_spinning_before_torch_loads() -> None:
    """The draft and target service packages set GOMP_SPINCOUNT on import, before anything loads torch
    (libgomp reads it once, when torch loads it); a value the environment sets wins."""
    probe = "import sys, os, {pkg}; print(os.environ['GOMP_SPINCOUNT'], 'torch' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    for pkg in ("draft_service", "target_service"):
        out = subprocess.run([sys.executable, "-c", probe.format(pkg=pkg)], env=env, capture_output=True, text=True)
        assert out.stdout.split() == [SERVICE_SPIN_COUNT, "False"], out.stderr
    chosen = subprocess.run(
        [sys.executable, "-c", probe.format(pkg="draft_service")], env={**env, "GOMP_SPINCOUNT": "5"},
        capture_output=True, text=True,
    )  # fmt: skip
    assert chosen.stdout.split() == ["5", "False"]

"""The Ray scenario of tests/e2e/test_ray.py, run inside a private network namespace.

`python tests/e2e/ray_scenario.py DRAFT TARGET WORKDIR`: starts a local Ray cluster (it can
only bind loopback here), deploys Calispec into the pair's namespace seeded with a calibration file
(as `calispec up` does), serves a request, scales targets 1 -> 2 under
load, checks both replicas served and recorded into the shared memory, scales 2 -> 1 under
load (the removed replica drains: every request succeeds), then `calispec ray down` through
the CLI. Prints one `RESULT {json}` line; exits non-zero on any failed check.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ray

from calispec.client import CalispecClient
from calispec_tools.deploy import ray_actors as deploy_ray
from calispec_tools.memory_reads import memory_events
from calispec_tools.namespaces import pair_namespace
from tests.helpers import write_recorded_export

NAMESPACE = "calispec-test"  # the Ray namespace
SEEDED = [(1, 2, 3), (4, 5, 7)]  # the calibration's (draft, target, count)
PROMPTS = ["zebra quantum xylophone", "The robot counted", "def fibonacci(n):", "A rectangle with sides"]
MODEL_ARGS = ["--dtype", "float32", "--device", "cpu"]


def config(draft: str, target: str, work: Path) -> deploy_ray.RayDeployConfig:
    small = {"num_cpus": 0.5, "args": MODEL_ARGS}
    calibration = write_recorded_export(work / "calibration.json", pair_namespace(Path(draft), Path(target)), SEEDED)
    return deploy_ray.RayDeployConfig.from_dict({
        "namespace": NAMESPACE,
        "host": "127.0.0.1",
        "models": {"draft": draft, "target": target},
        "calibration": str(calibration),  # memory_namespace: auto (the default): the pair's, which it is for
        "memory_db": str(work / "memory.db"),
        "drain_timeout_s": 60,
        "start_timeout_s": 180,
        "memory": {"num_cpus": 0.5, "args": ["--flush-interval", "0.1"]},
        "draft": small,
        "target": {**small, "replicas": 1, "args": [*MODEL_ARGS, "--memory-sync-interval", "0.1"]},
        "coordinator": {"num_cpus": 0.5, "port": 0},
    })  # fmt: skip


class Load:
    """Requests in a loop from two threads until stopped; every one must succeed."""

    def __init__(self, address: str) -> None:
        self.client = CalispecClient(address, timeout=120)
        self.done = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()  # `done += 1` from two threads
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(2)
        self._futures = [self._pool.submit(self._loop, i) for i in range(2)]

    def _loop(self, worker: int) -> None:
        i = worker
        while not self._stop.is_set():
            try:
                # a fixed γ: every round drafts, so every replica verifies drafts and counts rejections
                # (adaptive γ may judge drafting not worth it for the tiny pair and run target-only)
                self.client.generate(PROMPTS[i % len(PROMPTS)], max_new_tokens=12, mode="csd", num_speculative_tokens=4)
                with self._lock:
                    self.done += 1
            except Exception as exc:
                self.errors.append(repr(exc))
            i += 2

    def wait_until(self, reached: Callable[[], bool], what: str, timeout_s: float = 180) -> None:
        """Keep the load on until `reached()` (polled) or a request fails; fail at the deadline. A count of
        requests was not enough: after a scale-up the two threads could keep to the old replica, or the new one
        verify only prompts whose drafts the target accepts whole (one run of `make test-slow` failed once)."""
        wait_for(lambda: bool(self.errors) or reached(), timeout_s, what)

    def __enter__(self) -> Load:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for f in self._futures:
            f.result()
        self._pool.shutdown()


def settled(stats: dict, memory_address: str, namespace: str) -> bool:
    """Every replica shipped all it counted, and the memory holds exactly the seeded events plus the sum."""
    replicas = targets(stats).values()
    flushed = all(s["events_unshipped"] == 0 and s["batches_in_flight"] == 0 for s in replicas)
    counted = sum(c for *_, c in SEEDED) + sum(s["events_counted"] for s in replicas)
    return flushed and memory_events(memory_address, namespace) == counted


def wait_for(probe: Callable[[], bool], timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not met in {timeout_s:.0f} s")
        time.sleep(0.1)


def targets(stats: dict) -> dict[str, dict]:
    return {name: s for name, s in stats.items() if s["kind"] == "target"}


def every_replica_served() -> bool:
    """Every target replica was picked and counted rejection events (what the scale-up checks)."""
    stats = deploy_ray.stats(NAMESPACE)
    picks = stats["coordinator"]["picks"]
    replicas = targets(stats).values()
    return all(picks.get(s["address"], 0) > 0 and s["events_counted"] > 0 for s in replicas)


def main(draft: str, target: str, work: Path) -> dict:
    t0 = time.monotonic()
    context = ray.init(
        num_cpus=8, include_dashboard=False, namespace=NAMESPACE, log_to_driver=False,
        _node_ip_address="127.0.0.1", _temp_dir=str(work / "ray"),
    )  # fmt: skip
    result: dict = {"ray_start_s": round(time.monotonic() - t0, 1)}
    try:
        status = deploy_ray.up(config(draft, target, work))
        result["up_s"] = round(time.monotonic() - t0, 1)
        namespace = status["memory_namespace"]
        assert namespace == pair_namespace(Path(draft), Path(target)), status
        assert status["calibration"] == "calibration: loaded 2 pairs (10 events) from calibration.json", status
        assert status["default_lambda"] is None, status  # no λ was chosen for this file: the paper's
        result["seeded_events"] = memory_events(status["addresses"]["memory"], namespace)
        coordinator = status["coordinator"]
        with CalispecClient(coordinator, timeout=120) as client:
            first = client.generate("def add(a, b):", max_new_tokens=8, mode="sd")
        assert first.stats.emitted > 0, first

        with Load(coordinator) as load:
            status = deploy_ray.scale(2, NAMESPACE)
            assert len(status["targets"]) == 2, status
            load.wait_until(every_replica_served, "both replicas picked and counting events")
        assert not load.errors, load.errors
        result["scale_up_s"] = round(time.monotonic() - t0, 1)

        memory = status["addresses"]["memory"]
        wait_for(lambda: settled(deploy_ray.stats(NAMESPACE), memory, namespace))
        stats = deploy_ray.stats(NAMESPACE)
        picks = stats["coordinator"]["picks"]
        replicas = targets(stats)
        assert all(picks.get(s["address"], 0) > 0 for s in replicas.values()), (picks, replicas)
        assert all(s["events_counted"] > 0 for s in replicas.values()), replicas
        result.update(picks=picks, events={n: s["events_counted"] for n, s in replicas.items()})
        result["memory_events"] = memory_events(memory, namespace)

        with Load(coordinator) as load:  # scale down under load: the removed replica drains, nothing fails
            load.wait_until(lambda: targets(deploy_ray.stats(NAMESPACE))["target-1"]["open_sessions"] > 0, "busy")
            status = deploy_ray.scale(1, NAMESPACE)
            after = load.done
            load.wait_until(lambda: load.done >= after + 2, "two requests after the scale-down")
        assert len(status["targets"]) == 1 and not load.errors, (status, load.errors)
        result["requests_during_scale_down"] = load.done

        cli = [sys.executable, "-m", "calispec_tools.cli_ray", "down", "--address", context.address_info["gcs_address"]]
        down = subprocess.run([*cli, "--namespace", NAMESPACE], capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr[-2000:]
        assert not ray.util.list_named_actors(), ray.util.list_named_actors()
        result["total_s"] = round(time.monotonic() - t0, 1)
        return result
    finally:
        ray.shutdown()


if __name__ == "__main__":
    out = main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
    print("RESULT " + json.dumps(out), flush=True)

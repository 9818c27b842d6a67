"""Teacher-forced calibration as a Ray job: the documents split over worker actors, each loading the pair.

Every worker runs the same `Calibrator` as the local command over its share and writes its events
itself, through the memory service's authenticated RecordEvents (the writer token, and under mutual TLS the
writing certificate's PEMs, travel to the workers as an actor argument, as the Ray deployment passes them to
target replicas). Counts add up, so the table after a Ray job equals the table after the same calibration in
one process.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import ray

from calispec_core.limits import INT8_SPLIT
from calispec_tools.calibrate.corpus import Document
from calispec_tools.calibrate.job import CalibrateConfig, Summary
from calispec_tools.calibrate.sink import MemoryWriter
from calispec_tools.memory_reads import memory_failure
from calispec_tools.pems import pem_files


@dataclass(frozen=True)
class RayJob:
    """What every worker needs: the pair (paths visible on every node) and where to write."""

    draft: str
    target: str
    dtype: str
    device: str
    memory: str  # memory service HOST:PORT, reachable from the workers
    namespace: str
    token: str = field(repr=False)  # the verifiers' writer token (out of repr, as the key below: a job gets logged)
    draft_dtype: str | None = None  # None: dtype
    int8_outliers: str = INT8_SPLIT  # int8 models' first-token outlier rows (calispec_core/int8_outliers.py)
    tls: dict[str, str] | None = field(default=None, repr=False)  # the writing certificate's PEMs (cert, key, ca)


REASON_CHARS = 400  # a worker's reason is one line of the driver's error, whatever the exception's message held


class WorkerFailed(RuntimeError):
    """A worker could not load the pair or calibrate its share; the message is the reason in one line (the
    traceback stays in the worker's log on its node)."""


@ray.remote
class CalibrationWorker:
    def __init__(self, job: RayJob, config: CalibrateConfig, rank: int) -> None:
        from calispec_tools.calibrate.job import Calibrator, load_pair

        self.job, self.rank = job, rank
        draft_dtype = job.draft_dtype or job.dtype
        pair = load_pair(job.draft, job.target, job.dtype, job.device, draft_dtype, job.int8_outliers)
        self.calibrator = Calibrator(*pair, config)

    def run(self, docs: list[Document]) -> Summary:
        import grpc

        job, vocab = self.job, self.calibrator.target.vocab_size
        try:
            with pem_files(job.tls) as tls:  # the channel reads the PEMs when it is made: the files need not outlive it
                writer = MemoryWriter(job.memory, job.namespace, job.token, vocab, f"calibrate-ray-{self.rank}", tls)
            try:
                return self.calibrator.run(docs, writer.send)
            finally:
                writer.close()  # durable on return: the driver's total is in the table
        except grpc.RpcError as exc:  # it cannot be pickled (its call state holds a lock): its reason travels as text
            raise RuntimeError(memory_failure(job.memory, exc)) from None


def shard(docs: Sequence[Document], workers: int) -> list[list[Document]]:
    """Round-robin shares (documents come sorted by source, so each worker gets a mix)."""
    return [list(docs[i::workers]) for i in range(workers) if docs[i::workers]]


def run_on_ray(
    address: str | None,
    docs: Sequence[Document],
    config: CalibrateConfig,
    job: RayJob,
    workers: int,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 0.0,
) -> tuple[Summary, list[Summary]]:
    """(the job's summary, each worker's); joins the cluster at `address` unless Ray is already initialised."""
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    start = time.perf_counter()
    shares = shard(docs, workers)
    actors = [
        CalibrationWorker.options(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker).remote(job, config, rank)
        for rank in range(len(shares))
    ]
    try:
        parts: list[Summary] = ray.get([a.run.remote(s) for a, s in zip(actors, shares, strict=True)])
    except ray.exceptions.RayError as exc:
        raise WorkerFailed(failure_reason(exc)) from exc
    finally:
        for actor in actors:
            ray.kill(actor)
    total = Summary()
    for part in parts:
        total.add(part)
    total.total_s = time.perf_counter() - start  # wall time of the job: events/s of the whole cluster
    return total, parts


def failure_reason(exc: ray.exceptions.RayError) -> str:
    """What a worker raised, in one line: `Type: message` where Ray kept the exception; else, where Ray's report holds
    a traceback (an exception it could not pickle; an error in an actor's __init__, which reaches the driver only as
    text), the exception's own lines after its last frame; else (an actor Ray killed: out of memory, a lost node) the
    report's first line and the raylet's reason, its last."""
    cause = getattr(exc, "cause", None)  # RayTaskError: the worker's exception, or a RayError that describes it
    if isinstance(cause, BaseException) and not isinstance(cause, ray.exceptions.RayError):
        text = f"{type(cause).__name__}: {cause}"
    elif (report := str(exc)).find("\n  File ") >= 0:
        text = _exception_lines(report) or report.strip().splitlines()[-1]
    else:
        lines = [line.strip() for line in report.splitlines() if line.strip() and not line.startswith("\t")]
        text = (f"{lines[0]} {lines[-1]}" if len(lines) > 1 else lines[0]) if lines else type(exc).__name__
    return " ".join(text.split())[:REASON_CHARS]


def _exception_lines(report: str) -> str:
    """The lines after a traceback's last frame that are not its source (indented by spaces): the exception's."""
    lines = report.splitlines()
    last_frame = max(i for i, line in enumerate(lines) if line.startswith("  File "))
    return " ".join(line for line in lines[last_frame + 1 :] if line.strip() and not line.startswith(" "))

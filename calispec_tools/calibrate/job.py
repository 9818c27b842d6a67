"""A teacher-forced calibration run: documents -> batches of rows -> both forwards -> events -> a sink.

The same code runs in `calispec calibrate --corpus` (one process) and in each Ray worker.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from calispec_core import int8_gemm
from calispec_core.compute import compute_thread
from calispec_core.limits import INT8_SCALE_CALL, INT8_SCALE_CHOICES, INT8_SCALE_ROW
from calispec_core.modeling import INT8, ModelRunner, ModelSpec
from calispec_tools.arg_types import MIN_WINDOW_TOKENS
from calispec_tools.calibrate.corpus import Document, encode, windows
from calispec_tools.calibrate.generate import continue_greedy
from calispec_tools.calibrate.heap import keep_freed_memory
from calispec_tools.calibrate.teacher import EVENT_MODES, Pair, Row, SdRule, batch_events

Sink = Callable[[Counter[Pair]], None]
Progress = Callable[["Summary"], None]  # after every batch: the summary so far (total_s = elapsed)


@dataclass(frozen=True)
class CalibrateConfig:
    mode: str = "dense"  # "dense": every mismatch; "sd": exactly a greedy SD run's events (see teacher.py)
    generate: bool = False  # the target first continues every prompt; events come from its continuation
    gamma: int = 6  # sd mode: speculative tokens per round
    max_new_tokens: int = 128  # --generate: the continuation's budget (a request's max_new_tokens)
    max_tokens: int = 512  # documents are cut into windows of at most this many tokens; rows are packed this long
    batch_size: int = 8  # per batch: prompts continued together; text windows up to batch_size * max_tokens tokens
    int8_scales: str = INT8_SCALE_CALL  # an int8 draft's activation scales in its teacher-forced calls (limits.py)

    def validate(self) -> CalibrateConfig:
        if self.mode not in EVENT_MODES:
            raise ValueError(f"mode must be one of {EVENT_MODES}, got {self.mode!r}")
        if self.int8_scales not in INT8_SCALE_CHOICES:
            raise ValueError(f"int8_scales must be one of {INT8_SCALE_CHOICES}, got {self.int8_scales!r}")
        if not (self.gamma >= 1 and self.max_new_tokens >= 1 and self.batch_size >= 1):
            raise ValueError("gamma, max_new_tokens, batch_size must be >= 1")
        if self.max_tokens < MIN_WINDOW_TOKENS:  # the flags' own minimum (calispec_tools/arg_types.py)
            raise ValueError(f"max_tokens must be >= {MIN_WINDOW_TOKENS}, got {self.max_tokens}")
        return self


@dataclass
class Summary:
    documents: int = 0
    rows: int = 0
    rows_planned: int = 0  # text windows plus prompts (less those the target continues with nothing): the run's rows
    positions: int = 0  # predictions compared
    events: int = 0
    off_path: int = 0  # compared positions where the text is not the target's greedy choice
    generate_s: float = 0.0
    forward_s: float = 0.0
    total_s: float = 0.0
    pairs: Counter[Pair] = field(default_factory=Counter)

    def add(self, other: Summary) -> None:
        for name in ("documents", "rows", "rows_planned", "positions", "events", "off_path", "generate_s", "forward_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.pairs.update(other.pairs)

    @property
    def events_per_s(self) -> float:
        return self.events / self.total_s if self.total_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "pairs"}
        return {**out, "distinct_pairs": len(self.pairs), "events_per_s": self.events_per_s}


def load_pair(
    draft: str | Path, target: str | Path, dtype: str, device: str, draft_dtype: str, int8_outliers: str
) -> tuple[ModelRunner, ModelRunner]:
    """(draft, target) runners for calibration: the draft in the dtype that will propose, both with one int8 outlier
    rule (calispec_core/int8_outliers.py). The process's heap keeps what the forwards free from here on (heap.py);
    an int8 draft's layers are read for oneDNN's integer GEMM (calispec_core/int8_gemm.py)."""
    keep_freed_memory()
    draft_runner = ModelRunner(ModelSpec(Path(draft), draft_dtype, device, int8_outliers=int8_outliers))
    compute_thread().run(int8_gemm.prepare, draft_runner.model)  # its int8 calls over many rows (int8_gemm.py)
    return draft_runner, ModelRunner(ModelSpec(Path(target), dtype, device, int8_outliers=int8_outliers))


class Calibrator:
    """Both models of a pair, loaded once; `run` calibrates over documents and feeds a sink."""

    def __init__(self, draft: ModelRunner, target: ModelRunner, config: CalibrateConfig) -> None:
        self.draft, self.target, self.config = draft, target, config.validate()
        self.rule = SdRule(config.gamma, frozenset(target.eos_token_ids))
        self.row_scales = config.int8_scales == INT8_SCALE_ROW
        if self.row_scales:
            _check_row_scales(draft)

    def run(
        self, docs: Sequence[Document], sink: Sink = lambda events: None, progress: Progress | None = None
    ) -> Summary:
        start = time.perf_counter()
        summary = Summary(documents=len(docs))
        for batch in self.batches(docs, summary):
            t0 = time.perf_counter()
            result = batch_events(
                self.draft, self.target, batch, self.config.mode, self.rule, self.config.max_tokens, self.row_scales
            )
            summary.forward_s += time.perf_counter() - t0
            summary.rows += len(batch)
            summary.positions += result.positions
            summary.off_path += result.off_path
            summary.events += sum(result.events.values())
            summary.pairs.update(result.events)
            sink(result.events)
            summary.total_s = time.perf_counter() - start
            if progress is not None:
                progress(summary)
        summary.total_s = time.perf_counter() - start
        return summary

    def batches(self, docs: Sequence[Document], summary: Summary) -> Iterator[list[Row]]:
        """Text windows by token budget (the forward packs them, see teacher.greedy_predictions);
        continuations generated `batch_size` prompts at a time (shorter prompts together: less padding)."""
        tokenizer = self.target.tokenizer
        texts = [d for d in docs if not (self.config.generate and d.is_prompt)]
        prompts = [encode(tokenizer, d.text) for d in docs if self.config.generate and d.is_prompt]
        rows = [Row(w, 1) for d in texts for w in windows(encode(tokenizer, d.text), self.config.max_tokens)]
        summary.rows_planned = len(rows) + len(prompts)
        yield from _by_tokens(rows, self.config.batch_size * self.config.max_tokens)
        for group in _chunks(sorted(prompts, key=len), self.config.batch_size):
            t0 = time.perf_counter()
            outputs = continue_greedy(self.target, group, self.config.max_new_tokens)
            summary.generate_s += time.perf_counter() - t0
            batch = [Row(p + out, len(p), len(out), True) for p, out in zip(group, outputs, strict=True) if out]
            summary.rows_planned -= len(group) - len(batch)
            if batch:  # every prompt ended at once: nothing to compare
                yield batch


def _check_row_scales(draft: ModelRunner) -> None:
    """Row scales need the draft's int8 layers that quantise apart (`--int8-outliers split`) and the exact integer
    GEMM of calispec_core/int8_gemm.py on this machine; without either its calls would keep one scale each. A float
    draft has no activation scales: asking for them there is a mistake, said rather than ignored."""
    if draft.dtype_name != INT8:
        raise ValueError(f"int8 scales per row are for an int8 draft; this one runs in {draft.dtype_name}")
    if not draft.isolates_outliers:
        raise ValueError("int8 scales per row need the draft's int8 layers of --int8-outliers split")
    if not compute_thread().run(int8_gemm.exact_here, True):  # torch work: on the compute thread
        raise ValueError("int8 scales per row need oneDNN's integer GEMM, which is missing or not exact here")
    compute_thread().run(int8_gemm.prepare, draft.model, True)  # that path's weights, if not the ones load_pair read


def _by_tokens(rows: list[Row], budget: int) -> Iterator[list[Row]]:
    """Consecutive rows, each batch at most `budget` tokens (a longer row alone)."""
    batch: list[Row] = []
    size = 0
    for row in rows:
        if batch and size + len(row.tokens) > budget:
            yield batch
            batch, size = [], 0
        batch.append(row)
        size += len(row.tokens)
    if batch:
        yield batch


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]

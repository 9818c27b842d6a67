"""Rejection events of greedy speculative decoding, from batched teacher-forced forwards of each model.

Under greedy SD the committed sequence is the target's own greedy output y, and a draft token
is compared with the target's argmax on the *committed* prefix: within a round, every draft
token before the first mismatch equals y, so the draft's proposal for position j is its greedy
prediction d_j on the prefix y_<j, exactly what a teacher-forced forward over y computes (the
same for the target's t_j). A rejection event (x̃, t*) = (d_j, t_j) where they differ.

Which positions a greedy SD run verifies (`sd_event_positions`, the exact mode): a round that
starts at position s drafts g = min(γ, remaining − 1) tokens (the coordinator's rule) for
positions s..s+g−1. At the first mismatch j it records the event (d_j, t_j), emits t_j and the
next round starts at j + 1. With no mismatch, position s+g is a *bonus* position: the target
emits it without any draft to compare, so a mismatch there is never an event, and the next
round starts at s+g+1. A round with g = 0 (one token left) is a plain target step. The run
ends after the round that emits EOS or the last token of the budget; its last round may
verify positions past the EOS it emits, which is why `generate` continues past EOS.

So the events of a greedy SD run are the mismatches at every position except bonus positions
and plain steps. The *dense* mode counts every mismatch (a superset: bonus positions too),
and also applies to text the target did not write (a corpus), where no SD run exists: there
an event is what SD would record at that position if the committed prefix were the text.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from calispec_core import int8_gemm
from calispec_core.argmax import argmax_last
from calispec_core.compute import on_compute_thread
from calispec_core.int8_outliers import Int8Linear, isolating_outliers
from calispec_core.modeling import ModelRunner

Pair = tuple[int, int]  # (draft token id, target token id)
EVENT_MODES = ("dense", "sd")


@dataclass(frozen=True)
class Row:
    """One document for the forward passes: its tokens, and where events may start."""

    tokens: list[int]
    start: int  # first position whose prediction counts (1 for text; the prompt length for continuations)
    budget: int | None = None  # SD mode: the request's max_new_tokens (positions start..start+budget-1)
    target_written: bool = False  # tokens[start:] are the target's own greedy output (a --generate continuation)


@dataclass(frozen=True)
class SdRule:
    gamma: int
    eos_ids: frozenset[int]


def pack_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Row indices grouped into bins of at most `capacity` tokens (first fit, longest first).

    A forward computes every token of its bins, so padding rows to the longest in the batch
    wastes what the bins save: 16 corpus windows of 24..512 tokens padded to 512 computed 8,192
    tokens for ~3,700 real ones."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        slot = next((b for b, free in enumerate(room) if free >= lengths[i]), None)
        if slot is None:
            bins.append([])
            room.append(capacity)
            slot = len(bins) - 1
        bins[slot].append(i)
        room[slot] -= lengths[i]
    return bins


FORWARD_TOKENS = 512
"""Tokens of one teacher-forced forward (whole packed sequences; a longer sequence alone). Bigger forwards ran
slower, not faster: the int8 draft over 13 sequences of 512 tokens at once took 30.8-31.9 s, one at a time
16.6-20.5 s (docs/measurements/wave42-amx/teacher-forward-budget.txt), likely because their activations (its MLP:
19 KB a token in float32) pass what glibc reuses of freed memory, so each forward faults them in afresh, and in a
process holding a model a page fault costs microseconds (docs/calibration.md, "Throughput", wave 42)."""


@on_compute_thread
@torch.inference_mode()
def greedy_predictions(
    runner: ModelRunner, rows: Sequence[list[int]], capacity: int = 0, chunk: int = 512, row_scales: bool = False
) -> list[list[int]]:
    """out[b][i] = the model's argmax after rows[b][: i + 1] (it predicts position i + 1).

    The rows are packed end to end into sequences of `capacity` tokens (at least the longest row)
    under a block-diagonal causal mask, each row at its own positions from 0, so a row sees nothing
    but itself and no padded token is computed beyond each sequence's tail. Sequences go through the
    model at most `FORWARD_TOKENS` tokens a forward (a longer sequence alone). The output head runs
    over the real positions only, `chunk` at a time, so the full [N, V] logits never exist at once.
    `row_scales`: an int8 model's calls quantise every row on its own scale, as serving's one-token steps do
    (`int8_gemm.many_rows`). Runs on the compute thread, like every forward."""
    lengths = [len(r) for r in rows]
    width = max(capacity, *lengths)
    bins = pack_rows(lengths, width)
    per_forward = max(1, FORWARD_TOKENS // max(width, 1))
    out: list[list[int]] = [[] for _ in rows]
    for i in range(0, len(bins), per_forward):
        group = bins[i : i + per_forward]
        members = [r for b in group for r in b]
        packed = _packed_argmax(runner, rows, group, width, chunk, row_scales)
        for r, predictions in zip(members, packed, strict=True):
            out[r] = predictions
    return out


def _packed_argmax(
    runner: ModelRunner, rows: Sequence[list[int]], bins: list[list[int]], width: int, chunk: int, row_scales: bool
) -> list[list[int]]:
    """One forward over `bins` (sequences of `width` tokens, each the rows it lists end to end); the argmax of
    every real position, per row, in the order the bins list them."""
    device = runner.device
    ids = torch.zeros(len(bins), width, dtype=torch.long, device=device)  # [B, S]
    positions = torch.zeros_like(ids)  # [B, S]
    segment = torch.full_like(ids, -1)  # [B, S] which row a token belongs to (-1: padding)
    spans: list[tuple[int, int, int]] = []  # (bin, offset, length) of each row, in bin order
    for b, members in enumerate(bins):
        offset = 0
        for r in members:
            n = len(rows[r])
            ids[b, offset : offset + n] = torch.tensor(rows[r], dtype=torch.long, device=device)
            positions[b, offset : offset + n] = torch.arange(n, device=device)
            segment[b, offset : offset + n] = r
            spans.append((b, offset, n))
            offset += n
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()  # [S, S]
    mask = (segment[:, :, None] == segment[:, None, :]) & causal  # [B, S, S] own row, earlier tokens
    real = (segment >= 0).view(-1).nonzero().squeeze(1)  # [N] flat indices of real tokens, in bin order
    head = runner.model.get_output_embeddings()
    # every row starts at position 0 (int8_outliers.py); int8 calls over many rows on oneDNN, same bits (int8_gemm.py)
    with isolating_outliers(runner.isolates_outliers), int8_gemm.many_rows(row_scales):
        hidden = runner.model.base_model(
            input_ids=ids, attention_mask=mask[:, None], position_ids=positions, use_cache=False
        ).last_hidden_state  # [B, S, H]
        flat = hidden.reshape(-1, hidden.shape[-1])[real]  # [N, H]
        preds = torch.cat([_greedy(head, flat[i : i + chunk]) for i in range(0, flat.shape[0], chunk)])  # [N]
    table = torch.full((len(bins) * width,), -1, dtype=torch.long, device=device)  # [B*S]
    table[real] = preds
    grid = table.view(len(bins), width).tolist()  # [B][S]
    return [grid[b][offset : offset + n] for b, offset, n in spans]


def _greedy(head: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:  # [R, H] -> [R]
    """The output layer's argmax per row; an int8 head's straight from its integer GEMM (Int8Linear.greedy)."""
    return head.greedy(rows) if isinstance(head, Int8Linear) else argmax_last(head(rows))


def dense_event_positions(draft: Sequence[int], target: Sequence[int], row: Row) -> list[int]:
    """Every position >= row.start whose draft and target predictions differ (draft[i-1] predicts i)."""
    end = len(row.tokens) if row.budget is None else min(len(row.tokens), row.start + row.budget)
    return [i for i in range(max(row.start, 1), end) if draft[i - 1] != target[i - 1]]


def sd_event_positions(draft: Sequence[int], target: Sequence[int], row: Row, rule: SdRule) -> list[int]:
    """The positions where a greedy SD run over row.tokens (the target's own output) records events."""
    require_budget = row.budget if row.budget is not None else len(row.tokens) - row.start
    end = row.start + require_budget  # positions < end are the request's output
    events: list[int] = []
    s = row.start
    while s < end:
        g = min(rule.gamma, end - s - 1)
        if s + g >= len(row.tokens):
            break  # the text ends before this round does: the run cannot be followed further
        mismatch = next((j for j in range(s, s + g) if draft[j - 1] != target[j - 1]), None)
        if mismatch is not None:
            events.append(mismatch)
            emitted_end = mismatch + 1
        else:
            emitted_end = s + g + 1  # g drafts accepted, then the bonus (or the plain step when g = 0)
        if any(target[j - 1] in rule.eos_ids for j in range(s, emitted_end)):
            break
        s = emitted_end
    return events


def row_events(
    draft: Sequence[int], target: Sequence[int], row: Row, mode: str, rule: SdRule | None = None
) -> list[Pair]:
    """(x̃, t*) of every event of one row in the given mode ("dense" or "sd")."""
    if mode == "sd":
        assert rule is not None, "sd mode needs the SD rule (γ, EOS)"
        positions = sd_event_positions(draft, target, row, rule)
    else:
        positions = dense_event_positions(draft, target, row)
    return [(draft[j - 1], target[j - 1]) for j in positions]


@dataclass
class BatchResult:
    events: Counter[Pair]
    positions: int  # predictions compared
    off_path: int  # positions >= start where the text is not the target's greedy choice (SD mode: should be 0)


def own_predictions(row: Row) -> list[int]:
    """The target's predictions on a row it wrote itself: out[i - 1] = tokens[i] for every i >= start.

    A --generate continuation *is* the target's greedy choice at each position (from its KV-cached
    decode, as in serving), so no second target forward is needed. Entries before `start` are the
    prompt's next tokens, which no event reads."""
    return [*row.tokens[1:], -1]


def batch_events(
    draft_runner: ModelRunner,
    target_runner: ModelRunner,
    rows: Sequence[Row],
    mode: str,
    rule: SdRule | None = None,
    capacity: int = 0,
    row_scales: bool = False,
) -> BatchResult:
    """Both forwards over one batch (the draft's only, for rows the target wrote), then every row's
    events; rows packed into sequences of `capacity` tokens, an int8 draft's rows on scales of their own with
    `row_scales` (see greedy_predictions)."""
    tokens = [r.tokens for r in rows]
    draft = greedy_predictions(draft_runner, tokens, capacity, row_scales=row_scales)
    if all(r.target_written for r in rows):
        target = [own_predictions(r) for r in rows]
    else:
        target = greedy_predictions(target_runner, tokens, capacity)
    events: Counter[Pair] = Counter()
    positions = off_path = 0
    for row, d, t in zip(rows, draft, target, strict=True):
        events.update(row_events(d, t, row, mode, rule))
        span = range(max(row.start, 1), len(row.tokens))
        positions += len(span)
        off_path += sum(row.tokens[i] != t[i - 1] for i in span)
    return BatchResult(events, positions, off_path)

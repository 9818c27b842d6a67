"""Sparse draft distributions q: a few (token, probability) entries per draft token (no gRPC here).

The draft proposes from its q truncated to the K most likely tokens and renormalised (or from q's
own support, when top-k / top-p already make it smaller) and sends exactly that distribution, so
speculative sampling against it stays exact: the verifier only needs the q the draft sampled from.
About γ × K × 8 bytes a round instead of γ × V × 4 (K = 256 vs a 150k vocabulary: ~300× less).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from calispec_core.errors import InvalidArgument, require

PROBS_TOLERANCE = 1e-3  # |sum(q) - 1| allowed per row (float32 renormalised rows are far closer)


@dataclass(frozen=True)
class SparseQ:
    """Row i (draft token i) gives probs[j] to token_ids[j] for its row_sizes[i] entries, rows in order.

    Host arrays (numpy: a few hundred entries, where each torch op would cost more than its work)."""

    row_sizes: list[int]
    token_ids: np.ndarray  # [N] int64, N = sum(row_sizes)
    probs: np.ndarray  # [N] float32

    @classmethod
    def of_rows(cls, rows: list[tuple[torch.Tensor, torch.Tensor]]) -> SparseQ:
        """From per-row (ids [n_i], probs [n_i]) tensors."""
        return cls(
            [len(ids) for ids, _ in rows],
            torch.cat([ids for ids, _ in rows]).long().cpu().numpy(),
            torch.cat([p for _, p in rows]).float().cpu().numpy(),
        )

    def row_index(self) -> np.ndarray:  # [N] the row of every entry
        return np.repeat(np.arange(len(self.row_sizes)), self.row_sizes)

    def validate(self, rows: int, vocab_size: int, draft: Sequence[int] | None = None) -> SparseQ:
        """A real distribution per draft token over tokens < vocab_size, each token listed once, and (given the
        `draft` tokens) giving each drafted token q > 0; a faulty q would silently break lossless sampling."""
        require(
            len(self.row_sizes) == rows,
            f"draft_sparse_probs must have one row per draft token ({rows}), got {len(self.row_sizes)}",
        )
        n = sum(self.row_sizes)
        require(
            len(self.token_ids) == n and len(self.probs) == n,
            f"draft_sparse_probs rows hold {n} entries but carry {len(self.token_ids)} token ids "
            f"and {len(self.probs)} probabilities",
        )
        require(min(self.row_sizes, default=1) > 0, "every draft_sparse_probs row needs at least one entry")
        if n == 0:
            return self
        require(int(self.token_ids.max()) < vocab_size, f"draft_sparse_probs token ids must be < {vocab_size}")
        require(bool(np.isfinite(self.probs).all()), "draft_sparse_probs must be finite")
        require(float(self.probs.min()) >= 0, "draft_sparse_probs must be >= 0")
        index = self.row_index()
        worst = float(np.abs(np.bincount(index, weights=self.probs, minlength=rows) - 1).max())
        if worst > PROBS_TOLERANCE:
            raise InvalidArgument(f"each draft_sparse_probs row must sum to 1 (off by {worst:.3g})")
        keys = index * vocab_size + self.token_ids
        require(len(np.unique(keys)) == n, "a draft_sparse_probs row lists a token more than once")
        if draft is not None:
            self._check_drafted(index, np.asarray(draft, dtype=np.int64))
        return self

    def _check_drafted(self, index: np.ndarray, draft: np.ndarray) -> None:
        """The draft sampled token i from row i, so q_i(x̃_i) > 0; a q without it is not the q it sampled from
        (the verifier would reject the token every time, silently)."""
        drafted = np.zeros(len(draft), dtype=bool)  # [rows]
        drafted[index[(self.token_ids == draft[index]) & (self.probs > 0)]] = True
        if not drafted.all():
            i = int(np.flatnonzero(~drafted)[0])
            raise InvalidArgument(
                f"draft token {i} (id {int(draft[i])}) has probability 0 in its draft_sparse_probs row: "
                "q must be the distribution the draft sampled it from"
            )

    def densify(self, vocab_size: int, device: torch.device | str) -> torch.Tensor:
        """[rows, vocab_size] float32 on `device` (the entries travel, the zeros are made there)."""
        return self.write_into(torch.zeros(len(self.row_sizes), vocab_size, dtype=torch.float32, device=device))

    def write_into(self, dense: torch.Tensor) -> torch.Tensor:
        """Set the entries in `dense` ([rows, > every id], zeros elsewhere), on its device."""
        device = dense.device
        index = (torch.from_numpy(self.row_index()).to(device), torch.from_numpy(self.token_ids).to(device))
        return dense.index_put_(index, torch.from_numpy(self.probs).to(device=device, dtype=dense.dtype))


def truncate(q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [V] -> (ids [n], probs [n]), n <= k: q's support when it has at most k tokens, else its
    k most likely tokens, renormalised. The draft samples from exactly this distribution."""
    probs, ids = q.topk(min(k, q.shape[-1]))
    kept = probs > 0
    probs, ids = probs[kept], ids[kept]
    return ids, probs / probs.sum()

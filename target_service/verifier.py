"""Verification of one speculative round for a batch of sessions: standard SD and Calibrated SD.

A pure tensor module: no gRPC, no I/O, no Python loop over draft positions. It turns the
target's logits for one forward pass over `prefix + draft` into the tokens the round emits.

Vocabulary (p = target distribution, q = draft distribution, both after the request's
temperature / top-k / top-p warping; z = the target's raw logits):

- **draft token** x̃_i: the i-th token the draft proposed (i = 0..num_draft-1).
- **target token** t*_i: the target's most likely token at position i, argmax z_i, for every
  row. Greedy SD emits it on a rejection; CSD's memory lookup, gate and recorded events use it
  whether the row is greedy or sampling (see "Sampling rows under CSD" below).
- **accepted** token: a draft token kept by the standard rule — x̃_i == argmax z_i (greedy),
  or the speculative-sampling coin min(1, p_i(x̃_i) / q_i(x̃_i)) came up heads
  (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding";
  Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling").
- **rescued** token: a draft token the standard rule rejected but Calibrated Speculative
  Decoding keeps (Zhou, Liu et al., "Calibrated Speculative Decoding", ACL 2026,
  arXiv 2604.13634): the pair (x̃_i, t*_i) was seen more than λ times in the Online
  Correction Memory (OCM) AND the Semantic Consistency Gate (SCG) passes,
  z_i(x̃_i) − z_i(t*_i) >= log τ on the raw target logits, and (when the service passes meaning
  keys: target_service/meaning_guard.py, Calispec's addition) both tokens carry the same numerals,
  operators or special role. Verification then continues with
  x̃_{i+1}: the single target pass already conditioned z_{i+1} on x̃_i, so no extra forward.
  Modes OCM_ONLY / SCG_ONLY apply one test alone (ablations); AR / SD never rescue.
- **recovered** token: what the round emits at the first position a that is neither accepted
  nor rescued, ending the round there: t*_a when greedy; when sampling, a sample drawn from
  norm(max(0, p_a − q_a)) (from p_a if that residual is all zero).
- **bonus** token: when every draft token is kept, one more token from position num_draft
  (argmax z when greedy, a sample from p otherwise).
- **rejection event**: a (x̃_i, t*_i) pair at a rescued position or at the final rejected
  position with x̃_i != t*_i; these feed the correction memory.
- **refused** token: a draft token whose logit is -inf, i.e. a structured output's grammar forbids it
  there (the target masks the logits before verification: calispec_core/constraints.py), or a request's logit
  rules do (allowed token ids, min_tokens, min_p). It has no probability,
  so it is rejected, never rescued, and records no event: the pair says nothing about the draft's
  confusions, only about the grammar.
- **shaped** row: one whose logits a request's logit rules changed (penalties, logit bias, ...:
  calispec_core/logit_rules.py) before verification; z and t* are the shaped ones, and the row records no
  events: its pairs would teach the shared memory one request's preferences, not the draft's confusions.

The round emits `draft_tokens[b, :accepted_count[b]]` followed by `next_token[b]`. Greedy rows
reproduce target-only greedy decoding exactly in mode SD; sampling rows in mode SD are
lossless. CSD is lossy by design (rescued tokens are the draft's).

Randomness (so that seeded requests reproduce and the slow reference in the tests can
replicate it draw for draw): each *sampling* row (temperature > 0) with n = num_draft[b] draws,
every round, exactly `u = torch.rand(2 * n + 1, generator=generators[b], device=logits.device)`
(float32):

- `u[i]` for i in [0, n): the acceptance coin at position i (accept iff q > 0 and u·q < p);
- `u[n + j]` for j in [0, n]: the inverse-CDF uniform of the token sampled at position j — the
  recovered sample for j < n, the bonus sample for j == n.

Greedy rows draw nothing. Consumption depends only on the row itself, never on the batch it
shares (its padded width or its neighbours), so a seeded request reproduces however the
service batches it. Every generator must live on the logits' device. Sampling uses the inverse CDF on a float32
cumulative sum (resolution ~6e-8, like torch.multinomial), never a token of probability 0.

Sampling rows under CSD (the paper evaluates greedy only; our rule, docs/robustness.md): the
OCM lookup, the SCG comparison and the recorded event use t*_i = argmax z_i exactly as greedy
decoding does, never the recovered sample. A random draw from the residual is often a
low-probability token, against which the gate z(x̃_i) − z(t*_i) >= log τ is far easier to pass
than in greedy decoding, and its pairs would land in the memory that greedy requests read.
What the round emits is unchanged: a rescued token is still x̃_i, and a final rejection still
emits the recovered sample. A coin-accepted position is no rejection (no event, no rescue
test). A coin-rejected x̃_i that *is* argmax z_i is no CSD rejection either (greedy would have
accepted it; there is no confusion pair): no rescue test, no event; the recovered sample ends
the round as in SD. The gate compares raw logits, so a rescued token may lie outside the
top-k / top-p set.

Host syncs: one read of two [B] flags — which rows sample (all-greedy batches skip the
sampling path; each sampling row draws its uniforms) and which rows may rescue (AR/SD-only
batches skip the memory lookup) — plus warp_probs' check whether any row truncates. The
verification math itself stays on the device. Mixed batches run both paths over every row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from calispec_core.argmax import argmax_last
from calispec_core.errors import require
from calispec_core.generation import Mode  # modes that may rescue are exactly those >= CSD (verify() relies on it)
from calispec_core.sampling import warp_probs

PLACEHOLDER_TOKEN_ID = -1

# (draft_ids [N] int64, target_ids [N] int64) -> counts [N] int64: the correction memory.
PairCountFn = Callable[[Tensor, Tensor], Tensor]


@dataclass
class VerifyInput:
    """One round for B sessions, padded to G draft positions. All tensors on the logits' device."""

    target_logits: Tensor  # [B, G+1, V] raw logits; position i predicts draft token i, num_draft[b] the bonus
    draft_tokens: Tensor  # [B, G] int64, PLACEHOLDER_TOKEN_ID beyond num_draft[b]
    num_draft: Tensor  # [B] int64 in [0, G]; 0 = plain decode step
    draft_probs: Tensor | None  # [B, G, V_draft <= V] float q, warped like p; None if no row samples a draft
    temperature: Tensor  # [B] float32; 0 = greedy
    top_k: Tensor  # [B] int64; 0 = off
    top_p: Tensor  # [B] float32; 0 or 1 = off
    mode: Tensor  # [B] int64 Mode values
    log_tau: Tensor  # [B] float32, log τ of the SCG gate
    lambda_: Tensor  # [B] int64, OCM count threshold (rescuable iff count > λ)
    generators: list[torch.Generator]  # [B], each on the logits' device
    shaped: Tensor | None = None  # [B] bool: rows whose logits a request's logit rules reshaped (None: none)

    def check_shapes(self) -> None:
        """Shape, dtype and device checks that need no host sync (verify() runs them)."""
        require(self.target_logits.dim() == 3, "target_logits must be [B, G+1, V]")
        batch, width, vocab = self.target_logits.shape
        draft_width = width - 1
        require(draft_width >= 0, "target_logits needs at least one position")
        device = self.target_logits.device
        require(self.draft_tokens.shape == (batch, draft_width), f"draft_tokens must be [{batch}, {draft_width}]")
        for name in ("num_draft", "temperature", "top_k", "top_p", "mode", "log_tau", "lambda_"):
            value: Tensor = getattr(self, name)
            require(value.shape == (batch,), f"{name} must be [{batch}], got {list(value.shape)}")
            require(value.device == device, f"{name} must be on {device}, got {value.device}")
        require(self.draft_tokens.device == device, f"draft_tokens must be on {device}")
        for name in ("draft_tokens", "num_draft", "top_k", "mode", "lambda_"):
            require(getattr(self, name).dtype == torch.int64, f"{name} must be int64")
        if self.draft_probs is not None:
            shape = self.draft_probs.shape
            require(
                self.draft_probs.dim() == 3 and shape[:2] == (batch, draft_width) and shape[2] <= vocab,
                f"draft_probs must be [{batch}, {draft_width}, <= {vocab}], got {list(shape)}",
            )
            require(self.draft_probs.device == device, f"draft_probs must be on {device}")
        require(len(self.generators) == batch, f"need {batch} generators, got {len(self.generators)}")
        if self.shaped is not None:
            require(self.shaped.shape == (batch,) and self.shaped.dtype == torch.bool, f"shaped must be [{batch}] bool")
            require(self.shaped.device == device, f"shaped must be on {device}")

    def validate(self) -> VerifyInput:
        """Value checks on top of check_shapes(); these sync with the device, so the service runs
        them where the inputs are built (cheap on host tensors), not inside verify()."""
        self.check_shapes()
        draft_width = self.draft_tokens.shape[1]
        vocab = self.target_logits.shape[2]
        n = self.num_draft
        require(bool(((n >= 0) & (n <= draft_width)).all()), f"num_draft must be in [0, {draft_width}]")
        valid = torch.arange(draft_width, device=n.device).view(1, -1) < n.view(-1, 1)  # [B, G]
        tokens = self.draft_tokens
        require(bool(((tokens >= 0) & (tokens < vocab))[valid].all()), f"draft tokens must be in [0, {vocab})")
        require(bool((tokens[~valid] == PLACEHOLDER_TOKEN_ID).all()), "padding must be PLACEHOLDER_TOKEN_ID")
        require(bool(torch.isfinite(self.temperature).all() and (self.temperature >= 0).all()), "bad temperature")
        require(bool((self.top_k >= 0).all()), "top_k must be >= 0")
        require(bool(((self.top_p >= 0) & (self.top_p <= 1)).all()), "top_p must be in [0, 1]")
        known = torch.tensor([int(m) for m in Mode], device=self.mode.device)
        require(bool(torch.isin(self.mode, known).all()), "mode must be a Mode value")
        require(bool((n[self.mode == Mode.AR] == 0).all()), "mode AR rows must have num_draft == 0")
        require(not bool(torch.isnan(self.log_tau).any()), "log_tau must not be NaN")
        require(bool((self.lambda_ >= 0).all()), "lambda_ must be >= 0")
        if self.draft_probs is None:
            samples_draft = (self.temperature > 0) & (n > 0)
            require(not bool(samples_draft.any()), "draft_probs is required for sampling rows with drafts")
        device = self.target_logits.device
        for g in self.generators:
            require(g.device == device, f"generators must be on {device}, got {g.device}")
        return self


@dataclass
class VerifyOutput:
    """What the round emits: draft_tokens[b, :accepted_count[b]] then next_token[b]."""

    accepted_count: Tensor  # [B] int64 draft tokens kept (accepted + rescued), counted from the first
    rescued: Tensor  # [B, G] bool, True at positions kept by the CSD rescue (all < accepted_count)
    next_token: Tensor  # [B] int64 recovered token (position accepted_count) or bonus (all kept)
    next_is_bonus: Tensor  # [B] bool
    event_mask: Tensor  # [B, G] bool rejection events: rescued positions + the final rejected one
    target_tokens: Tensor  # [B, G] int64 t* = argmax z per position, PLACEHOLDER_TOKEN_ID beyond num_draft
    withheld: Tensor  # [B, G] bool: the final rejection, where CSD's tests passed and the meaning guard refused
    finite: Tensor  # [B] bool: the row's logits were usable (False: NaN / inf, its tokens are noise; see verify())

    def events(self, draft_tokens: Tensor) -> tuple[Tensor, Tensor]:
        """(draft_ids [E], target_ids [E]) of this round's rejection events, for the memory."""
        return draft_tokens[self.event_mask], self.target_tokens[self.event_mask]


def verify(inp: VerifyInput, pair_counts: PairCountFn, meaning_keys: Tensor | None = None) -> VerifyOutput:
    """Verify one round for every row of the batch, from the logits of one target pass. `meaning_keys`
    ([V] int64 on the logits' device, target_service/meaning_guard.py): a rescue also needs equal keys.

    `finite` flags rows whose logits hold NaN or inf at some position (damaged weights, a float16 overflow), from
    values the rules compute anyway: a greedy row's maximum logit (the argmax lands on a NaN), a sampling row's
    distribution mass (softmax turns NaN, +inf or all -inf into NaN). The caller must not commit such a row."""
    inp.check_shapes()
    logits = inp.target_logits  # [B, G+1, V]
    draft_width = logits.shape[1] - 1
    positions = torch.arange(draft_width, device=logits.device)  # [G]
    valid = positions.view(1, -1) < inp.num_draft.view(-1, 1)  # [B, G] real draft slots
    draft = torch.where(valid, inp.draft_tokens, 0)  # [B, G] placeholders -> 0, safe to gather

    # The one host sync of the round: which rows sample, which may rescue (to skip unneeded paths),
    # and each row's draft length (how much randomness a sampling row draws).
    sampling, rescuing, lengths = torch.stack([inp.temperature > 0, inp.mode >= Mode.CSD, inp.num_draft]).tolist()
    sampling_rows, rescue_rows = [bool(s) for s in sampling], [bool(r) for r in rescuing]
    accepted, emitted, finite = _standard_rule(inp, draft, valid, sampling_rows, lengths)  # [B, G], [B, G+1], [B]
    accepted &= valid
    # t* of CSD for every row: greedy rows already emit the argmax; sampling rows need it separately.
    target = argmax_last(logits[:, :draft_width]) if any(sampling_rows) else emitted[:, :draft_width]  # [B, G]
    z_draft = logits[:, :draft_width].gather(-1, draft.unsqueeze(-1)).squeeze(-1).float()  # [B, G] raw z(x̃)
    refused = z_draft == float("-inf")  # [B, G] forbidden by the row's grammar (structured output)
    confused = valid & ~accepted & ~refused & (draft != target)  # [B, G] rejected with a (x̃, t*) confusion pair

    rescued = torch.zeros_like(confused)  # [B, G]
    withheld = torch.zeros_like(confused)  # [B, G] rescues the meaning guard refused
    if any(rescue_rows):
        rescued = confused & _rescue_mask(inp, draft, z_draft, target, pair_counts)
        if meaning_keys is not None:
            same_meaning = meaning_keys[draft] == meaning_keys[target]  # [B, G] numerals, operators, role
            withheld, rescued = rescued & ~same_meaning, rescued & same_meaning
    kept_prefix = (accepted | rescued).cumprod(dim=-1).bool()  # [B, G] kept, and so was everything before
    accepted_count = kept_prefix.sum(dim=-1)  # [B]
    rescued &= kept_prefix  # a rescue after the round ended never happened
    final_rejection = positions.view(1, -1) == accepted_count.view(-1, 1)  # [B, G]
    final_rejection &= confused  # none when every draft token was kept (bonus), nor without a pair
    return VerifyOutput(
        accepted_count=accepted_count,
        rescued=rescued,
        next_token=emitted.gather(1, accepted_count.view(-1, 1)).view(-1),  # [B]
        next_is_bonus=accepted_count == inp.num_draft,
        event_mask=(rescued | final_rejection) & ~_shaped(inp).view(-1, 1),
        withheld=withheld & final_rejection,  # only the one that ended the round was ever reached
        target_tokens=torch.where(valid, target, PLACEHOLDER_TOKEN_ID),
        finite=finite,
    )


def _shaped(inp: VerifyInput) -> Tensor:  # [B] bool
    return inp.shaped if inp.shaped is not None else torch.zeros_like(inp.num_draft, dtype=torch.bool)


def _standard_rule(
    inp: VerifyInput,
    draft: Tensor,  # [B, G] int64 draft tokens, placeholders replaced by 0
    valid: Tensor,  # [B, G] bool
    sampling_rows: list[bool],  # [B] temperature > 0, on the host
    lengths: list[int],  # [B] num_draft, on the host
) -> tuple[Tensor, Tensor, Tensor]:  # accepted [B, G] bool (before masking), emitted [B, G+1] int64, finite [B]
    """Standard SD per row: greedy matching or speculative sampling; each path runs only if needed."""
    if not any(sampling_rows):
        return _greedy_rule(inp.target_logits, draft)
    uniforms = _draw_uniforms(inp.generators, sampling_rows, lengths, draft.shape[1], draft.device)  # [B, 2G+1]
    accepted, sampled, finite = _speculative_sampling(inp, draft, valid, uniforms)
    if all(sampling_rows):
        return accepted, sampled, finite
    greedy_accepted, greedy_tokens, greedy_finite = _greedy_rule(inp.target_logits, draft)
    greedy = (inp.temperature <= 0).view(-1, 1)  # [B, 1]
    return (
        torch.where(greedy, greedy_accepted, accepted),
        torch.where(greedy, greedy_tokens, sampled),
        torch.where(greedy.view(-1), greedy_finite, finite),
    )


def _greedy_rule(
    logits: Tensor,  # [B, G+1, V]
    draft: Tensor,  # [B, G] int64
) -> tuple[Tensor, Tensor, Tensor]:  # accepted [B, G] bool, t* [B, G+1] int64 (G: the bonus), finite [B] bool
    target_tokens = argmax_last(logits)  # [B, G+1]
    top = logits.gather(-1, target_tokens.unsqueeze(-1)).squeeze(-1)  # [B, G+1] the maxima; NaN where one is
    return draft == target_tokens[:, : draft.shape[1]], target_tokens, top.isfinite().all(dim=-1)


def _draw_uniforms(
    generators: list[torch.Generator],
    sampling_rows: list[bool],
    lengths: list[int],
    draft_width: int,
    device: torch.device,
) -> Tensor:  # [B, 2G+1] float32: coins at [0, n), sample uniforms at [G, G+n]; zeros elsewhere
    """Each sampling row's randomness for this round, from its own generator (see module doc)."""
    uniforms = torch.zeros(len(generators), 2 * draft_width + 1, device=device)  # [B, 2G+1]
    for b, (g, samples, n) in enumerate(zip(generators, sampling_rows, lengths, strict=True)):
        if samples:
            u = torch.rand(2 * n + 1, generator=g, device=device)  # [2n+1]: as many as the row needs
            uniforms[b, :n] = u[:n]
            uniforms[b, draft_width : draft_width + n + 1] = u[n:]
    return uniforms


def _speculative_sampling(
    inp: VerifyInput,
    draft: Tensor,  # [B, G] int64 draft tokens, placeholders replaced by 0
    valid: Tensor,  # [B, G] bool
    uniforms: Tensor,  # [B, 2G+1] float32
) -> tuple[Tensor, Tensor, Tensor]:  # accepted [B, G] bool, sampled tokens [B, G+1] int64, finite [B] bool
    """Lossless speculative sampling: the acceptance coins and the token sampled at every position."""
    logits = inp.target_logits  # [B, G+1, V]
    draft_width = logits.shape[1] - 1
    p = warp_probs(logits, inp.temperature, inp.top_k, inp.top_p)  # [B, G+1, V]
    p_draft = p[:, :draft_width]  # [B, G, V]
    p_tok = p_draft.gather(-1, draft.unsqueeze(-1)).squeeze(-1)  # [B, G]
    residual = p_draft.clone()  # [B, G, V] becomes the unnormalised max(0, p - q)
    if inp.draft_probs is None:  # only rows without drafts sample; q is irrelevant there
        q_tok = torch.zeros_like(p_tok)  # [B, G]
    else:
        q = inp.draft_probs.float()  # [B, G, V_draft]; tokens the draft lacks have q = 0
        draft_vocab = q.shape[-1]
        q_tok = q.gather(-1, draft.clamp(max=draft_vocab - 1).unsqueeze(-1)).squeeze(-1)  # [B, G]
        q_tok = torch.where(draft < draft_vocab, q_tok, 0.0)
        residual[..., :draft_vocab].sub_(q).clamp_(min=0)
    # u < p/q without dividing; q == 0 is a rejection (the draft could not have proposed it).
    accepted = (q_tok > 0) & (uniforms[:, :draft_width] * q_tok < p_tok)  # [B, G]

    # Position j < G samples from the residual if it holds a draft token and the residual has
    # mass, otherwise from p: that is the bonus when j == num_draft. Position G: bonus only.
    use_residual = valid & (residual.sum(dim=-1) > 0)  # [B, G]
    weights = torch.where(use_residual.unsqueeze(-1), residual, p_draft, out=residual)  # [B, G, V]
    recovered, recovered_mass = _inverse_cdf(weights, uniforms[:, draft_width : 2 * draft_width])  # [B, G] x2
    last_bonus, bonus_mass = _inverse_cdf(p[:, draft_width:], uniforms[:, 2 * draft_width :])  # [B, 1] x2
    # p of a position with NaN / inf logits is all NaN, and so is the mass it was sampled from (residual or p)
    finite = torch.cat([recovered_mass, bonus_mass], dim=1).isfinite().all(dim=-1)  # [B]
    return accepted, torch.cat([recovered, last_bonus], dim=1), finite


def _inverse_cdf(
    weights: Tensor,  # [..., V] non-negative, not necessarily normalised, positive sum
    uniforms: Tensor,  # [...] in [0, 1)
) -> tuple[Tensor, Tensor]:  # [...] int64 samples, [...] the weights' sums
    """Sample index k with probability weights[k] / sum(weights), never one of weight 0. The sums returned are the
    weights' own: NaN or inf where they hold one (the caller's finite check reads them)."""
    cdf = weights.cumsum(dim=-1)  # [..., V]
    total = cdf[..., -1:].contiguous()  # [..., 1]
    if flattens(cdf.device):  # the CPU's cumsum adds in double: a weight-0 token's sum is its predecessor's
        cdf = flat_at_zero_weights(cdf, weights)  # NaN rows become all 0 here: `total` keeps them visible
    mass = cdf[..., -1:].contiguous()  # [..., 1] the sum the picks scale: total on a CPU, the flattened one on a GPU
    picked = torch.searchsorted(cdf, uniforms.unsqueeze(-1) * mass, right=True)  # [..., 1]
    # Defensive (u < 1 keeps u * mass < mass in float32): never step past the last token with mass.
    last = torch.searchsorted(cdf, mass)  # [..., 1]
    return torch.minimum(picked, last).squeeze(-1), total.squeeze(-1)


def flattens(device: torch.device) -> bool:
    """Whether the inverse CDF flattens its sums across weight-0 tokens on `device` (a GPU's parallel scan)."""
    return device.type != "cpu"


def flat_at_zero_weights(
    cdf: Tensor,  # [..., V] running sums of `weights`
    weights: Tensor,  # [..., V] non-negative
) -> Tensor:  # [..., V] the same sums, a weight-0 token's equal to the last positive one's before it (0 if none)
    """A GPU's parallel scan sums float32 in another order than a sequential one: a token of weight 0 may end a
    few ulps above its predecessor, and the inverse CDF would then pick it, about once in 5 million draws of a
    top-k row (a CUDA audit's emulation; `searchsorted(right=True)` skips a token whose sum equals the one before)."""
    kept = torch.where(weights > 0, cdf, torch.zeros((), dtype=cdf.dtype, device=cdf.device))  # [..., V]
    return kept.cummax(dim=-1).values


def _rescue_mask(
    inp: VerifyInput,
    draft: Tensor,  # [B, G] int64 draft tokens, placeholders replaced by 0
    z_draft: Tensor,  # [B, G] float32 their raw logits
    target: Tensor,  # [B, G] int64 t* per position
    pair_counts: PairCountFn,
) -> Tensor:  # [B, G] bool: x̃_i would be rescued if rejected
    """The CSD tests per row mode: OCM count > λ and/or SCG gate z(x̃) - z(t*) >= log τ."""
    logits = inp.target_logits[:, : draft.shape[1]]  # [B, G, V] raw logits
    z_target = logits.gather(-1, target.unsqueeze(-1)).squeeze(-1).float()  # [B, G]
    gate = z_draft - z_target >= inp.log_tau.view(-1, 1)  # [B, G]; NaN (-inf - -inf) fails
    counts = pair_counts(draft.reshape(-1), target.reshape(-1)).reshape(draft.shape)  # [B, G]
    frequent = counts.to(draft.device) > inp.lambda_.view(-1, 1)  # [B, G]
    mode = inp.mode.view(-1, 1)  # [B, 1]
    csd = (mode == Mode.CSD) & frequent & gate
    ocm_only = (mode == Mode.OCM_ONLY) & frequent
    scg_only = (mode == Mode.SCG_ONLY) & gate
    return csd | ocm_only | scg_only

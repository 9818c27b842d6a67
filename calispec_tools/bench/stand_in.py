"""`python -m calispec_tools.bench.stand_in --draft D --target T --agreement 0.85 --out DIR`: a stand-in pair
with the architectures of D and T (their config.json and tokenizer) whose greedy draft agrees with the greedy
target on a chosen share of tokens, for timing the stack where the real weights cannot be copied (a lent GPU
takes 64 MiB per call and reaches no network; the Qwen pair is 4.6 GiB).

Each stand-in runs every layer of its architecture at full cost, but the layers' output projections
(attention's o_proj, the MLP's down_proj) are zero, so the residual stream is the token's embedding and the
next token is a fixed function of the last one: next(x) = argmax_y H[y]·E[x] with E's rows random unit
vectors and H[y] the sum of E[x] over the x that should be followed by y. The target's function is a
permutation of the ordinary (non-special) tokens, so greedy text never ends early; the draft's equals it on a
share `agreement` of tokens and names another ordinary token elsewhere. Acceptance then follows that share,
while every forward costs what the real model's does (dense kernels do not skip zeros). What it cannot
reproduce: where the real pair's rejections fall (bursts in prose, long agreeing runs in code) and the draft's
confidence (always near 1 here), so adaptive γ and CSD's rescues see a different text than the real pair's.
The default share, 0.85, is about what the real pair's CPU runs imply: ~70 % of drafted tokens accepted at a
mean γ of 3.5 (docs/waves.md, wave 16) is what independent agreement of 0.85 per token gives.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from calispec_tools.models.weights import save_model

# what a model dir needs besides weights (the tokenizer and chat template travel with the stand-in)
COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
ZEROED = ("o_proj", "down_proj")  # each layer's writes to the residual stream


def ordinary_ids(model_dir: Path, vocab: int) -> torch.Tensor:
    """The ids below `vocab` that the tokenizer knows and are not added (special) tokens: [R]."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ordinary = torch.arange(vocab) < len(tokenizer.get_vocab())  # [V] rows past the tokenizer: padding
    ordinary[[i for i in tokenizer.added_tokens_decoder if i < vocab]] = False
    return ordinary.nonzero().squeeze(-1)


def next_maps(vocab: int, ordinary: torch.Tensor, agreement: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(target_next [V], draft_next [V]): every id's greedy successor, always an ordinary id; the target's is a
    permutation of the ordinary ids, the draft's equals it on a random share `agreement` of ids."""
    generator = torch.Generator().manual_seed(seed)
    target_next = ordinary[torch.randint(len(ordinary), (vocab,), generator=generator)]  # [V] specials: any
    target_next[ordinary] = ordinary[torch.randperm(len(ordinary), generator=generator)]
    differs = torch.rand(vocab, generator=generator) >= agreement  # [V]
    shift = torch.randint(1, len(ordinary), (vocab,), generator=generator)  # [V] never 0: another ordinary id
    place = torch.searchsorted(ordinary, target_next)  # [V] each successor's index among the ordinary ids
    draft_next = torch.where(differs, ordinary[(place + shift) % len(ordinary)], target_next)  # [V]
    return target_next, draft_next


@torch.no_grad()
def build_stand_in(like: Path, out: Path, next_ids: torch.Tensor, seed: int, dtype: torch.dtype) -> Path:
    """A model with `like`'s architecture whose greedy successor of token x is next_ids[x]; saved to `out`."""
    config = AutoConfig.from_pretrained(like)
    config.tie_word_embeddings = False  # H differs from E (a tied head would make every token follow itself)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    vocab, hidden = config.vocab_size, config.hidden_size
    generator = torch.Generator().manual_seed(seed)
    embed = torch.nn.functional.normalize(torch.randn(vocab, hidden, generator=generator), dim=-1)  # [V, d]
    head = torch.zeros(vocab, hidden).index_add_(0, next_ids, embed)  # [V, d] H[y] = Σ E[x] over next(x) = y
    model.get_input_embeddings().weight.copy_(embed)
    model.get_output_embeddings().weight.copy_(head)
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in ZEROED:
            module.weight.zero_()
    out.mkdir(parents=True, exist_ok=True)
    save_model(model, out)
    for name in COPIED[1:]:
        if (like / name).exists():
            shutil.copy(like / name, out / name)
    return out


def build_stand_in_pair(
    draft: Path, target: Path, out: Path, agreement: float, seed: int = 0, dtype: torch.dtype = torch.bfloat16
) -> tuple[Path, Path]:
    """(draft, target) stand-ins under `out`, for the pair (draft, target)."""
    vocab = AutoConfig.from_pretrained(target).vocab_size
    if AutoConfig.from_pretrained(draft).vocab_size != vocab:
        raise ValueError(f"the draft's vocabulary differs from the target's ({vocab}): not a pair")
    target_next, draft_next = next_maps(vocab, ordinary_ids(target, vocab), agreement, seed)
    return (
        build_stand_in(draft, out / "draft", draft_next, seed + 1, dtype),
        build_stand_in(target, out / "target", target_next, seed + 2, dtype),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m calispec_tools.bench.stand_in", description=__doc__)
    parser.add_argument("--draft", type=Path, required=True, help="the draft's model dir (config and tokenizer)")
    parser.add_argument("--target", type=Path, required=True, help="the target's model dir")
    parser.add_argument("--agreement", type=float, default=0.85, help="share of tokens the greedy draft gets right")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="writes OUT/draft and OUT/target")
    args = parser.parse_args(argv)
    if not 0.0 <= args.agreement <= 1.0:
        parser.error("--agreement must be in [0, 1]")
    draft, target = build_stand_in_pair(args.draft, args.target, args.out, args.agreement, args.seed)
    print(f"stand-ins (agreement {args.agreement}): draft {draft}, target {target}")


if __name__ == "__main__":
    main()

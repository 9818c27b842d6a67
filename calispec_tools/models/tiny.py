"""Tiny model pairs made offline, for tests and for the demo until a real pair is cached.

A byte-level BPE tokenizer is trained on the corpus below, then a small Llama-style
target and an even smaller draft are trained on the same text for a few hundred steps.
Trained (not random) weights give peaked distributions, so greedy decoding has few
near-ties, and the draft agrees with the target often but not always, like a real pair.
Nothing is downloaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from calispec_tools.models.weights import save_model

EOS = "<|endoftext|>"

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "def multiply(a, b):\n    return a * b\n",
    "def square(x):\n    return x * x\n",
    "def is_even(n):\n    return n % 2 == 0\n",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "def reverse(s):\n    return s[::-1]\n",
    "for i in range(10):\n    print(i * i)\n",
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding lets a small draft model propose tokens that a large target model verifies.",
    "The target model checks every draft token in one forward pass and keeps the ones it agrees with.",
    "Calibrated speculative decoding rescues draft tokens that are right in meaning but different in form.",
    "If a train travels 60 miles in 2 hours, its speed is 30 miles per hour.",
    "Tom has 3 apples and buys 5 more, so he has 8 apples in total.",
    "A rectangle with sides 4 and 6 has an area of 24 and a perimeter of 20.",
    "The sum of the first ten positive integers is 55.",
    "Once upon a time there was a little robot who loved to count the stars.",
    "Every morning the robot counted the stars again, and every morning there were more.",
    "Answer: the result is 42.",
    "Question: what is 7 times 6? Answer: 42.",
    "Question: what is 12 plus 30? Answer: 42.",
]


@dataclass(frozen=True)
class TinySpec:
    hidden_size: int
    num_layers: int
    steps: int
    seed: int


TARGET = TinySpec(hidden_size=96, num_layers=2, steps=300, seed=0)
DRAFT = TinySpec(hidden_size=48, num_layers=1, steps=150, seed=1)
VOCAB_SIZE = 384
MAX_CONTEXT = 1024


def build_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS)


def _training_batch(tokenizer: PreTrainedTokenizerFast) -> torch.Tensor:
    """All corpus lines, EOS-terminated, concatenated and cut into 64-token rows."""
    ids: list[int] = []
    for line in CORPUS:
        ids += [*tokenizer.encode(line), tokenizer.eos_token_id]
    width = 64
    ids += ids[: width - len(ids) % width]
    return torch.tensor(ids, dtype=torch.long).view(-1, width)


def build_model(spec: TinySpec, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    torch.manual_seed(spec.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.hidden_size * 2,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_CONTEXT,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    batch = _training_batch(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(spec.steps):
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def _complete(model_dir: Path) -> bool:
    return (model_dir / "config.json").is_file() and (model_dir / "model.safetensors").is_file()


def build_tiny_pair(out_dir: Path) -> tuple[Path, Path]:
    """Write `out_dir/target` and `out_dir/draft` (HF format, shared tokenizer); reuse if present."""
    target_dir, draft_dir = out_dir / "target", out_dir / "draft"
    marker = out_dir / "tiny-pair.json"
    if marker.exists() and all(_complete(path) for path in (target_dir, draft_dir)):
        return target_dir, draft_dir  # (a pair missing a file since is built again: it was reported as built)
    hf_logging.disable_progress_bar()
    threads = torch.get_num_threads()
    torch.set_num_threads(min(threads, 2))  # tiny matmuls: more threads only add overhead
    try:
        tokenizer = build_tokenizer()
        for spec, path in ((TARGET, target_dir), (DRAFT, draft_dir)):
            save_model(build_model(spec, tokenizer), path)
            tokenizer.save_pretrained(path)
    finally:
        torch.set_num_threads(threads)
    marker.write_text(json.dumps({"target": TARGET.__dict__, "draft": DRAFT.__dict__}))
    return target_dir, draft_dir

"""Model directories written by the tools (pull, tiny pair, stand-in): weight files readable as the umask allows."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from calispec_tools.models.weights import current_umask, save_model


@pytest.fixture
def umask() -> Iterator[None]:
    before = os.umask(0o022)
    yield
    os.umask(before)


def _tiny_model() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=1,
        num_key_value_heads=1, max_position_embeddings=16,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_weights_are_readable_as_the_config_is(tmp_path: Path, umask: None) -> None:
    """safetensors writes 0600: a pair pulled by one account was unreadable to another (a service user)."""
    save_model(_tiny_model(), tmp_path)
    (weights,) = tmp_path.glob("*.safetensors")
    assert _mode(weights) == _mode(tmp_path / "config.json") == 0o644


def test_a_private_umask_keeps_them_private(tmp_path: Path, umask: None) -> None:
    os.umask(0o077)
    assert current_umask() == 0o077
    save_model(_tiny_model(), tmp_path)
    assert {_mode(p) for p in tmp_path.iterdir()} == {0o600}

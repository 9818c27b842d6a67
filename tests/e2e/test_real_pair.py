"""The real Qwen2.5-Coder pair through all four services (slow; needs `calispec models pull qwen-coder`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from calispec.client import CalispecClient
from calispec_tools.cli import cache_dir
from calispec_tools.models.registry import PAIRS, chat_prompt, pulled
from calispec_tools.stack import LocalStack, StackConfig

pytestmark = pytest.mark.slow

PAIR = "qwen-coder"
CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(text: str) -> str:
    """The first fenced block (the closing fence may be cut off by max_new_tokens), else the whole text."""
    match = CODE_BLOCK.search(text)
    return match.group(1) if match else text


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    pair = pulled(cache_dir(), PAIR)
    if pair is None:
        pytest.skip(f"the {PAIR} pair is not cached in {cache_dir()}: run `calispec models pull {PAIR}` first")
    tmp: Path = tmp_path_factory.mktemp("real-pair")
    config = StackConfig(
        draft_model=pair.draft, target_model=pair.target, memory_db=tmp / "memory.db", log_dir=tmp / "logs",
        coordinator_port=0, target_port=0, draft_port=0, memory_port=0, start_timeout_s=300,
    )  # fmt: skip
    with LocalStack(config) as s:
        yield s


def test_extract_code_handles_fences_and_truncation() -> None:
    assert extract_code("Here:\n```python\nx = 1\n```\nDone") == "x = 1\n"
    assert extract_code("```python\ndef f():\n    return 1\n") == "def f():\n    return 1\n"


def test_coding_prompt_answer_compiles(stack: LocalStack) -> None:
    prompt = chat_prompt(
        PAIRS[PAIR],
        "Write a Python function `is_palindrome(s: str) -> bool` that ignores case and non-alphanumeric "
        "characters. Reply with only the code in one ```python block, no explanation.",
    )
    with CalispecClient(stack.coordinator_address, timeout=600) as client:
        result = client.generate(prompt, max_new_tokens=160, mode="csd", num_speculative_tokens=6, timeout=600)
    code = extract_code(result.text)
    assert "def is_palindrome" in code, result.text
    compile(code, "<answer>", "exec")  # SyntaxError fails the test with the offending line
    assert result.stats.acceptance_rate > 0.3, result.stats

"""Eval scorers: numbers extracted from answers; code pass / fail / timeout in the sandbox."""

from __future__ import annotations

import pytest

from calispec_tools.eval.scorers import (
    SandboxLimits,
    build_program,
    extract_final_number,
    score,
    score_code,
    score_math,
)
from calispec_tools.eval.tasks import TASK_SETS, load_tasks, render


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3 + 4 = 7, so she has 19 muffins.", 19.0),
        ("The answer is $1,234.50.", 1234.5),
        ("First 12, then \\boxed{42} and 7 more words", 42.0),
        ("#### -3", -3.0),
        ("Answer: 0.5 dollars, checked 3 times", 0.5),
        ("no digits here", None),
    ],
)
def test_extract_final_number(text: str, expected: float | None) -> None:
    assert extract_final_number(text) == expected


def test_score_math_compares_numerically() -> None:
    assert score_math(" 150 km", 150)
    assert score_math("It is 30.0", 30)
    assert not score_math("about 31", 30)
    assert not score_math("", 30)


def code_task():
    return next(t for t in load_tasks(["code"]) if t.entry_point == "add")


def test_code_pass_and_fail() -> None:
    task = code_task()
    passed = score_code(task, "    return a + b\n")
    assert passed.passed and passed.status == "passed"
    failed = score_code(task, "    return a - b\n")
    assert not failed.passed and failed.status == "failed" and "AssertionError" in failed.detail


def test_code_timeout_is_killed() -> None:
    result = score_code(code_task(), "    while True:\n        pass\n", SandboxLimits(timeout_s=1.0))
    assert not result.passed and result.status == "timeout"


def test_code_memory_is_limited() -> None:
    result = score_code(code_task(), "    x = bytearray(4 << 30)\n    return a + b\n")
    assert result.status == "failed" and "MemoryError" in result.detail


def test_fenced_chat_answers_stand_alone() -> None:
    task = code_task()
    program = build_program(task, "Here:\n```python\ndef add(a, b):\n    return a + b\n```\nDone.")
    assert program.count("def add") == 1 and task.tests in program
    assert score(task, "```python\ndef add(a, b):\n    return b + a\n```")[0]


@pytest.mark.parametrize("task_set", sorted(TASK_SETS))
def test_every_shipped_code_task_passes_its_canonical_solution(task_set: str) -> None:
    tasks = load_tasks(["code"], TASK_SETS[task_set])
    assert len(tasks) >= 12
    failures = [t.id for t in tasks if not score_code(t, t.canonical_solution).passed]
    assert failures == []


@pytest.mark.parametrize("task_set", sorted(TASK_SETS))
def test_shipped_math_tasks_render_and_have_answers(task_set: str) -> None:
    tasks = load_tasks(["math"], TASK_SETS[task_set])
    assert len(tasks) >= 12 and all(t.answer is not None for t in tasks)
    prompt, stops = render(tasks[0], "raw")
    assert prompt.startswith("Question: ") and prompt.endswith("Answer:") and stops
    chat, _ = render(tasks[0], "qwen-chat")
    assert chat.startswith("<|im_start|>user\n")

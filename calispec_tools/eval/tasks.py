"""Evaluation tasks shipped in calispec_tools/data/eval/ (written for this project) and their prompts.

code.jsonl: {"id", "entry_point", "prompt" (signature + docstring), "tests" (asserts), "canonical_solution"}
math.jsonl: {"id", "question", "answer" (a number)}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "eval"
# "eval": the tasks results are reported on; "dev": held-out tuning tasks in the same formats
# (other functions, other questions), where settings such as λ and τ are chosen before an
# evaluation run, so that no reported figure is tuned on its own tasks.
TASK_SETS = {"eval": DATA_DIR, "dev": DATA_DIR / "dev"}
PROMPT_FORMATS = ("raw", "qwen-chat")
# A completion of a function body ends where top-level code starts again.
CODE_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\nassert ", "\n#")
MATH_STOPS = ("\nQuestion:",)


@dataclass(frozen=True)
class Task:
    id: str
    kind: str  # "code" or "math"
    prompt: str  # as written in the data file
    tests: str = ""  # code
    entry_point: str = ""  # code
    answer: float | None = None  # math
    canonical_solution: str = ""  # code: a body that passes (the data's own check)


TASK_KINDS = ("code", "math")  # a data file each, DATA_DIR/<kind>.jsonl


def load_tasks(kinds: list[str], data_dir: Path = DATA_DIR, limit: int | None = None) -> list[Task]:
    """Tasks of the given kinds; `limit` keeps the first N of each kind (quick runs)."""
    tasks: list[Task] = []
    for kind in kinds:
        path = data_dir / f"{kind}.jsonl"
        if not path.is_file():
            raise ValueError(f"no task file {path} (kinds: code, math)")
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        tasks += [_task(kind, row) for row in rows[:limit]]
    return tasks


def _task(kind: str, row: dict) -> Task:
    if kind == "code":
        return Task(
            row["id"], kind, row["prompt"], row["tests"], row["entry_point"], None, row.get("canonical_solution", "")
        )
    return Task(row["id"], kind, row["question"], answer=float(row["answer"]))


def qwen_chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def render(task: Task, prompt_format: str = "raw") -> tuple[str, tuple[str, ...]]:
    """(prompt text, stop strings) for a task. Raw prompts suit completion; qwen-chat suits instruct pairs."""
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"prompt format must be one of {PROMPT_FORMATS}")
    if task.kind == "code":
        if prompt_format == "raw":
            return task.prompt, CODE_STOPS
        ask = f"Complete this Python function. Reply with the whole function in one code block.\n\n{task.prompt}"
        return qwen_chat(ask), ()
    if prompt_format == "raw":
        return f"Question: {task.prompt}\nAnswer:", MATH_STOPS
    return qwen_chat(f"{task.prompt}\nGive the final answer as a single number on the last line."), ()

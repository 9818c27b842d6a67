"""The calibration corpus is task-like but never the evaluation tasks (calispec_tools/data/eval/).

Checked over every document the calibration reads (calispec_tools/data/calibration/corpus/), with
whitespace and case normalised: no eval code prompt, no `def <entry point>(`, no math question, and
no corpus line that is a near copy of a math question (the same template with other numbers, or the
same numbers reworded). The checks are tried on planted copies too, so they are known to bite.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from difflib import SequenceMatcher

import pytest

from calispec_tools.calibrate.corpus import Document, load_corpus
from calispec_tools.eval.tasks import TASK_SETS, Task, load_tasks, qwen_chat
from calispec_tools.shipped_calibration import CORPUS_DIR

# prompt framing around a question in the corpus (chat tags, "Question:"/"Problem:"/"Answer:" labels)
FRAMING = re.compile(r"<\|im_(?:start|end)\|>(?:user|assistant)?|^\s*(?:question|problem|answer):", re.I | re.M)
NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
WORD = re.compile(r"\d+(?:[.,]\d+)*|\w+")
TEMPLATE_COPY = 0.65  # word similarity of the eval question with a few words or numbers changed
REWORDED_COPY = 0.3  # ... or, with exactly the same numbers, the same problem reworded


def normalise(text: str) -> str:
    return " ".join(text.lower().split())


def numbers(text: str) -> list[float]:
    return sorted(float(n.replace(",", "")) for n in NUMBER.findall(text))


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def exact_overlaps(docs: Sequence[Document], tasks: Sequence[Task]) -> list[str]:
    """Every (corpus document, eval task) where the document holds the task's prompt, question or entry point."""
    texts = [(d.source, normalise(d.text)) for d in docs]
    found = []
    for task in tasks:
        needle = normalise(task.prompt)
        definition = re.compile(rf"\bdef\s+{re.escape(task.entry_point)}\s*\(") if task.entry_point else None
        for source, text in texts:
            if needle in text or (definition is not None and definition.search(text)):
                found.append(f"{source}: {task.id}")
    return found


def question_lines(docs: Sequence[Document]) -> Iterator[tuple[str, str]]:
    for doc in docs:
        for line in FRAMING.sub("", doc.text).splitlines():
            if line.strip():
                yield doc.source, line


def near_copies(docs: Sequence[Document], tasks: Sequence[Task]) -> list[str]:
    """Corpus lines that are near copies of an eval math question (compared word by word)."""
    questions = [(t.id, words(t.prompt), numbers(t.prompt)) for t in tasks if t.kind == "math"]
    found = []
    matcher: SequenceMatcher[str] = SequenceMatcher(autojunk=False)
    for source, line in question_lines(docs):
        line_words = words(line)
        matcher.set_seq2(line_words)  # indexed once per line
        for task_id, question, question_numbers in questions:
            if not 0.5 <= len(line_words) / len(question) <= 2:
                continue
            matcher.set_seq1(question)
            if matcher.quick_ratio() < REWORDED_COPY:
                continue
            ratio = matcher.ratio()
            same_numbers = len(question_numbers) >= 2 and numbers(line) == question_numbers
            if ratio >= TEMPLATE_COPY or (same_numbers and ratio >= REWORDED_COPY):
                found.append(f"{source}: {task_id} ({ratio:.2f}): {line.strip()}")
    return found


@pytest.fixture(scope="module")
def corpus() -> list[Document]:
    return load_corpus(CORPUS_DIR)


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return load_tasks(["code", "math"])


def test_no_eval_prompt_entry_point_or_question_in_the_corpus(corpus: list[Document], tasks: list[Task]) -> None:
    assert {t.kind for t in tasks} == {"code", "math"} and len(corpus) > 400
    assert exact_overlaps(corpus, tasks) == []


def test_no_corpus_line_is_a_near_copy_of_an_eval_math_question(corpus: list[Document], tasks: list[Task]) -> None:
    assert near_copies(corpus, tasks) == []


def test_the_checks_catch_planted_copies(tasks: list[Task]) -> None:
    code, math = next(t for t in tasks if t.kind == "code"), next(t for t in tasks if t.kind == "math")
    planted = [
        Document(qwen_chat("Complete this:\n\n" + code.prompt.upper().replace("    ", "\t")), True, "chat"),
        Document(f"class Tool:\n    def  {code.entry_point} (self) -> None:\n        pass\n", False, "method"),
        Document(f"Question: {math.prompt}\nAnswer:", True, "question"),
    ]
    assert exact_overlaps(planted, tasks) == [f"chat: {code.id}", f"method: {code.id}", f"question: {math.id}"]
    copies = [
        ("template", "Question: A baker makes 30 muffins and sells 11 of them. She then bakes 9 more. How many "
                     "muffins does she have now?\nAnswer:"),
        ("template", "Tina is 6 years older than Bo. The sum of their ages is 40. How old is Tina?"),
        ("template", "A recipe uses 2 eggs for 10 pancakes. How many eggs for 30 pancakes?"),
        ("reworded", "Problem: A garden is 12 metres long and 7 metres wide. What is its area?"),
    ]  # fmt: skip
    found = near_copies([Document(text, False, f"{kind}{i}") for i, (kind, text) in enumerate(copies)], tasks)
    assert [hit.split(":")[0] for hit in found] == ["template0", "template1", "template2", "reworded3"]


@pytest.mark.parametrize("name", sorted(p.name for p in CORPUS_DIR.glob("*.jsonl")))
def test_every_prompt_file_has_unique_lines(name: str) -> None:
    lines = [line for line in (CORPUS_DIR / name).read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(lines) == len(set(lines))


def prompts(name: str) -> list[str]:
    return [json.loads(line)["prompt"] for line in (CORPUS_DIR / name).read_text(encoding="utf-8").splitlines()]


def test_the_task_like_prompts_have_the_eval_formats() -> None:
    stubs, problems, chats = prompts("code_stubs.jsonl"), prompts("math_problems.jsonl"), prompts("chat_prompts.jsonl")
    assert len(stubs) >= 250 and len(problems) >= 150 and len(chats) >= 60
    # a signature, a one-line docstring, a newline: as calispec_tools/data/eval/code.jsonl
    stub = re.compile(r'(def \w+\(.*\) -> .+:\n    """[^\n]+"""\n|class \w+:\n    """[^\n]+"""\n\n    def .+:\n)')
    assert [s for s in stubs if not stub.fullmatch(s)] == []
    assert all(p.startswith("Question: ") and p.endswith("\nAnswer:") and p.count("\n") == 1 for p in problems)
    assert all(c.startswith("<|im_start|>user\n") and c.endswith("<|im_end|>\n<|im_start|>assistant\n") for c in chats)


# --- the held-out tuning tasks (calispec eval --task-set dev) ----------------------------------------


@pytest.fixture(scope="module")
def dev_tasks() -> list[Task]:
    return load_tasks(["code", "math"], TASK_SETS["dev"])


def test_the_dev_tasks_are_not_in_the_calibration_corpus(corpus: list[Document], dev_tasks: list[Task]) -> None:
    assert {t.kind for t in dev_tasks} == {"code", "math"}
    assert exact_overlaps(corpus, dev_tasks) == [] and near_copies(corpus, dev_tasks) == []


def test_the_dev_tasks_are_not_the_eval_tasks(tasks: list[Task], dev_tasks: list[Task]) -> None:
    """Tuning on dev and reporting on eval means nothing if they share a task."""
    as_docs = [Document(t.prompt, False, t.id) for t in dev_tasks]
    assert exact_overlaps(as_docs, tasks) == [] and near_copies(as_docs, tasks) == []
    assert not {t.id for t in dev_tasks} & {t.id for t in tasks}

"""`calispec bench calibration`: which prompts it takes and how it reports (no models)."""

from __future__ import annotations

import json
from pathlib import Path

from calispec_core.host_memory import GIB
from calispec_tools.bench.calibration import (
    Method,
    benchmark_prompts,
    combined,
    format_report,
    interleaving,
    safetensors_parameters,
    split_rounds,
    teacher_forcing_bytes,
    text_documents,
)


def _corpus(tmp_path: Path) -> Path:
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"prompt": f"a{i}"}) for i in range(3)))
    (tmp_path / "b.jsonl").write_text(json.dumps({"prompt": "b0"}) + "\n" + json.dumps({"text": "doc"}))
    (tmp_path / "c.py").write_text("x = 1\n")
    return tmp_path


def test_prompts_are_taken_round_robin_over_the_prompt_files(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path)
    assert benchmark_prompts(3, corpus) == ["a0", "b0", "a1"]
    assert benchmark_prompts(10, corpus) == ["a0", "b0", "a1", "a2"]  # never more than the corpus holds


def test_text_documents_are_the_non_prompts(tmp_path: Path) -> None:
    assert sorted(d.text for d in text_documents(_corpus(tmp_path))) == ["doc", "x = 1\n"]


def test_the_shipped_corpus_has_prompts_and_text() -> None:
    assert len(benchmark_prompts(16)) == 16 and text_documents()


def test_report_gives_each_method_its_ratio_to_sd_through_the_stack() -> None:
    methods = [Method("SD", 10, 100, 10.0), Method("teacher", 500, 1000, 5.0)]
    report = format_report({"dtype": "bf16"}, methods)
    assert "dtype=bf16" in report
    last = report.splitlines()[-1].split()
    assert last[-2:] == ["100.00", "100.0"]  # 100 events/s, 100x the SD run's 1 event/s


def test_report_says_how_many_of_the_sd_runs_events_teacher_forcing_reproduced() -> None:
    from collections import Counter

    sd = Method("SD", 4, 100, 10.0, Counter({(1, 2): 3, (5, 6): 1}))
    teacher = Method("teacher", 5, 100, 1.0, Counter({(1, 2): 2, (7, 8): 3}))
    report = format_report({}, [sd, teacher])
    assert report.splitlines()[-1] == "same events: teacher holds 2 of the SD run's 4 events (50.0%); 3 others"
    assert "same events" not in format_report({}, [Method("SD", 0, 1, 1.0), teacher])  # nothing to compare


def test_the_bench_forwards_as_many_rows_as_make_calibration() -> None:
    """#12's throughput goal is about the shipped calibration's run: the bench measures that batch by default."""
    from calispec_tools.cli import build_parser

    recipe = (Path(__file__).resolve().parents[2] / "Makefile").read_text().split("\ncalibration:")[1].split("\n\n")[0]
    default = build_parser().parse_args(["bench", "calibration"])
    assert f"--batch-size {default.batch_size} " in recipe
    assert f"--int8-scales {default.int8_scales} " in recipe  # the shipped file's scales (wave 48)


def test_rounds_share_the_prompts_evenly_in_order() -> None:
    prompts = [f"p{i}" for i in range(7)]
    assert split_rounds(prompts, 3) == [["p0", "p1", "p2"], ["p3", "p4"], ["p5", "p6"]]
    assert split_rounds(prompts, 1) == [prompts]
    assert split_rounds(prompts[:2], 4) == [["p0"], ["p1"]]  # never an empty round


def test_a_methods_rounds_combine_into_one_run() -> None:
    from collections import Counter

    parts = [Method("m", 2, 10, 1.0, Counter({(1, 2): 2})), Method("m", 3, 20, 4.0, Counter({(1, 2): 1, (3, 4): 2}))]
    total = combined("m", parts)
    assert (total.events, total.positions, total.seconds) == (5, 30, 5.0)
    assert total.pairs == Counter({(1, 2): 3, (3, 4): 2}) and total.events_per_s == 1.0


def test_report_shows_each_rounds_ratio_to_that_rounds_sd() -> None:
    rounds = [
        [Method("SD", 2, 10, 2.0), Method("teacher-forced text (dense)", 50, 100, 1.0)],
        [Method("SD", 1, 10, 2.0), Method("teacher-forced text (dense)", 50, 100, 2.0)],
    ]
    methods = [combined(parts[0].label, parts) for parts in zip(*rounds, strict=True)]
    report = format_report({}, methods, rounds)
    assert "  round 1: SD 1.00, text (dense) 50.00 (50.0×)" in report
    assert "  round 2: SD 0.50, text (dense) 25.00 (50.0×)" in report
    assert "by round" not in format_report({}, methods, rounds[:1])  # one round: the totals say it all


def test_parameters_are_read_from_the_safetensors_headers(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.bfloat16)}, str(tmp_path / "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    save_file({"c": torch.zeros(2, 2)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    assert safetensors_parameters(tmp_path) == 12 + 5 + 4  # both shards; the metadata entry is no tensor
    # the target in its dtype (twice where its Linear weights get a packed copy), the draft as float32, the margin
    assert teacher_forcing_bytes(tmp_path, tmp_path, 2, 2) == 21 * 2 * 2 + 21 * 4 + GIB
    assert safetensors_parameters(tmp_path / "missing") is None  # no safetensors: size unknown
    assert teacher_forcing_bytes(tmp_path / "missing", tmp_path, 2, 1) is None


def test_rounds_interleave_only_where_the_pair_fits_beside_the_stack() -> None:
    """A float32 pair beside a float32 stack left 1.2 GiB of a 23.6 GiB VM and slowed the stack's sd 1.4-1.9x
    (wave 47, bench compare with Hugging Face's pair): the bench must not measure SD in such a state."""
    need = 10 * GIB
    interleave, note = interleaving(4, need, 13 * GIB)
    assert interleave and note == "4 (interleaved: ~10.0 GiB beside the stack, 13.0 available)"
    interleave, note = interleaving(4, need, 11 * GIB)  # 2 GiB must stay free
    assert not interleave and "not interleaved" in note and "~10.0 GiB" in note and "11.0 GiB available" in note
    assert not interleaving(4, need, None)[0]  # unknown (not Linux): the old order, which always fits
    assert not interleaving(4, None, 100 * GIB)[0]  # the pair's size unknown: the same
    assert interleaving(1, need, 100 * GIB) == (False, "1")

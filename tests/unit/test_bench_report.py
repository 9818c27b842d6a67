"""Bench report writers: the JSON has its schema keys and is strict JSON; plots are PNG files."""

from __future__ import annotations

import json

from calispec_tools.bench import report
from calispec_tools.bench.metrics import summarize_level
from tests.unit.test_bench_metrics import record


def levels() -> list[dict]:
    out = []
    for c in (1, 2):
        records = [record("ar", [1] * 4, e2e=1.0), record("sd", [3, 2], e2e=0.5)]
        out.append({"level": {"concurrency": c, "rate": None}, **summarize_level(records, ["ar", "sd"], 2.0),
                    "records": [r.to_dict() for r in records]})  # fmt: skip
    return out


def test_json_has_schema_config_definitions_and_raw_records(tmp_path) -> None:
    path = report.write_json(tmp_path / "bench.json", {"load": {"modes": ["ar", "sd"]}}, levels())
    doc = json.loads(path.read_text())  # strict parse: NaN would not be valid JSON
    assert doc["schema"] == report.SCHEMA
    assert {"config", "definitions", "levels"} <= doc.keys()
    level = doc["levels"][0]
    assert {"level", "window_s", "total", "modes", "ratios_to_ar", "records"} <= level.keys()
    assert level["modes"]["ar"]["acceptance_rate"] is None  # NaN (ar drafts nothing) → null
    assert level["records"][1]["chunk_tokens"] == [3, 2]
    assert set(level["modes"]["sd"]["e2e_s"]) == {"n", "mean", "p50", "p90", "p99"}


def test_table_has_a_row_per_mode_and_the_ratio() -> None:
    text = report.format_table(levels())
    assert text.count("concurrency") == 2
    assert any(line.strip().startswith("sd") and line.rstrip().endswith("×") for line in text.splitlines())


def test_plots_are_png_files(tmp_path) -> None:
    import matplotlib  # noqa: F401 - the `bench` extra, installed by `make install`

    paths = report.write_plots(tmp_path, levels())
    assert [p.name for p in paths] == ["latency_cdf.png", "throughput.png", "acceptance.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

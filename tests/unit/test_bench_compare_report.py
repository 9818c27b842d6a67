"""`calispec bench compare`'s report: the load table carries acceptance and batch size (no models)."""

from __future__ import annotations

import torch

from calispec_tools.bench.compare import format_report


def test_load_levels_report_throughput_ratio_acceptance_and_batch() -> None:
    level = {"requests": 16, "tokens": 100, "seconds": 10.0, "tokens_per_s": 10.0, "acceptance": 0.5, "max_batch": 8}
    load = {"ar": {8: {**level, "acceptance": float("nan"), "max_batch": 8}},
            "csd": {8: {**level, "tokens_per_s": 12.5, "acceptance": 0.75, "max_batch": 6}}}  # fmt: skip
    lines = format_report({"dtype": "bf16"}, {}, {}, load).splitlines()
    assert lines[0] == "environment: dtype=bf16"
    csd = next(line for line in lines if line.startswith("csd ") and "12.50" in line)
    assert csd.split()[-1] == "1.25"  # × ar
    assert lines[-1].split() == ["csd", "75.0%", "|", "6"]


def test_the_environment_names_the_instruction_set_caps_in_force(monkeypatch) -> None:
    from calispec_tools.bench.compare import ISA_CAP_VARS, isa_caps

    for name in ISA_CAP_VARS:
        monkeypatch.delenv(name, raising=False)
    assert isa_caps().startswith("none (aten ")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", "AVX2")
    assert isa_caps().startswith("ONEDNN_MAX_CPU_ISA=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 (aten ")


def test_the_environment_names_the_dtype_auto_resolves_to(monkeypatch) -> None:
    from calispec_core import modeling

    cpu = torch.device("cpu")
    monkeypatch.setattr(modeling, "cpu_has_fast_bf16", lambda: False)
    assert modeling.serving_dtype_name("auto", cpu) == "float32"
    monkeypatch.setattr(modeling, "cpu_has_fast_bf16", lambda: True)
    assert modeling.serving_dtype_name("auto", cpu) == "bfloat16"
    assert modeling.serving_dtype_name("int8", cpu) == "int8"

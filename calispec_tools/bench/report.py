"""Bench output: the terminal table, the JSON result file and the PNG plots. No gRPC here."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calispec_tools.bench.metrics import DEFINITIONS

SCHEMA = "calispec_tools.bench/1"


def _f(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value * scale:.{digits}f}"


def cell(value: float | None, spec: str) -> str:
    """A figure in `spec`'s format, or "-" where there is none (None or NaN: nothing to measure it on)."""
    return "-" if value is None or math.isnan(value) else format(value, spec)


def _pct(value: float | None) -> str:
    return cell(value, ".0%")


COLUMNS = (
    ("mode", 9), ("ok/n", 7), ("req/s", 7), ("tok/s", 7), ("TTFT p50", 9), ("TPOT", 7), ("ITL p50", 8),
    ("e2e mean", 9), ("p50", 7), ("p90", 7), ("p99", 7), ("accept", 7), ("acc/rnd", 8), ("rescue", 7),
    ("draft/target/mem/coord", 23), ("×ar tok/s", 10),
)  # fmt: skip


def mode_row(mode: str, s: dict[str, Any], ratio: dict[str, float] | None) -> list[str]:
    ms = 1000.0
    shares = "/".join(_pct(s["time_shares"][k]) for k in ("draft", "target", "memory", "coordinator"))
    return [
        mode, f"{s['ok']}/{s['requests']}", _f(s["request_throughput_rps"], digits=2), _f(s["output_tokens_per_s"]),
        _f(s["ttft_s"]["p50"], ms), _f(s["tpot_s"]["mean"], ms), _f(s["itl_s"]["p50"], ms),
        _f(s["e2e_s"]["mean"], ms), _f(s["e2e_s"]["p50"], ms), _f(s["e2e_s"]["p90"], ms), _f(s["e2e_s"]["p99"], ms),
        _pct(s["acceptance_rate"]), _f(s["mean_accepted_per_round"], digits=2), _pct(s["rescue_rate"]), shares,
        _f(ratio["output_tokens_per_s"], digits=2) + "×" if ratio else "-",
    ]  # fmt: skip


def format_level(level: dict[str, Any]) -> str:
    label = ", ".join(f"{k} {v}" for k, v in level["level"].items() if v is not None)
    t = level["total"]
    lines = [
        f"== {label}: {t['ok']}/{t['requests']} ok in {level['window_s']:.1f} s | "
        f"{_f(t['request_throughput_rps'], digits=2)} req/s, {_f(t['output_tokens_per_s'])} output tok/s "
        "(latencies in ms)",
        "  ".join(name.rjust(width) for name, width in COLUMNS),
    ]
    for mode, s in level["modes"].items():
        row = mode_row(mode, s, level["ratios_to_ar"].get(mode))
        lines.append("  ".join(cell.rjust(width) for cell, (_, width) in zip(row, COLUMNS, strict=True)))
        if s["errors"]:
            lines.append(f"   {mode} errors: " + ", ".join(f"{k} ×{v}" for k, v in sorted(s["errors"].items())))
    return "\n".join(lines)


def format_table(levels: Sequence[dict[str, Any]]) -> str:
    return "\n\n".join(format_level(level) for level in levels)


def jsonable(value: Any) -> Any:
    """Strict JSON: NaN and infinities become null, dict keys strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def write_json(path: Path, config: dict[str, Any], levels: Sequence[dict[str, Any]]) -> Path:
    doc = {"schema": SCHEMA, "config": config, "definitions": DEFINITIONS, "levels": list(levels)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(jsonable(doc), indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return path


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError("plots need matplotlib: pip install 'calispec[bench]' (or pass --no-plots)") from exc
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _cdf(ax: Any, values: list[float], label: str) -> None:
    if values:
        ordered = sorted(values)
        ax.step(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], where="post", label=label)


def _level_label(level: dict[str, Any]) -> str:
    lv = level["level"]
    return f"c={lv['concurrency']}" if lv.get("concurrency") is not None else f"rate={lv['rate']}"


def plot_latency_cdfs(path: Path, levels: Sequence[dict[str, Any]]) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for level in levels:
        for mode in level["modes"]:
            records = [r for r in level["records"] if r["mode"] == mode and r["error"] is None]
            label = f"{mode} {_level_label(level)}"
            _cdf(axes[0], [r["ttft_s"] * 1000 for r in records if r["ttft_s"] is not None], label)
            _cdf(axes[1], [r["e2e_s"] * 1000 for r in records if r["e2e_s"] is not None], label)
            gaps = [(b - a) * 1000 for r in records for a, b in itertools.pairwise(r["chunk_offsets_s"])]
            _cdf(axes[2], gaps, label)
    for ax, title in zip(axes, ("TTFT", "end-to-end latency", "inter-chunk latency"), strict=True):
        ax.set(title=title, xlabel="ms", ylabel="share of requests" if ax is axes[0] else None)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize="small")
    return _save(fig, path, plt)


def plot_throughput(path: Path, levels: Sequence[dict[str, Any]]) -> Path:
    plt = _pyplot()
    closed = levels[0]["level"].get("concurrency") is not None
    xs = [lv["level"]["concurrency"] if closed else lv["level"]["rate"] for lv in levels]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for mode in levels[0]["modes"]:
        axes[0].plot(xs, [lv["modes"][mode]["output_tokens_per_s"] for lv in levels], marker="o", label=mode)
        axes[1].plot(xs, [lv["modes"][mode]["e2e_s"]["p50"] * 1000 for lv in levels], marker="o", label=mode)
    xlabel = "concurrency (closed loop)" if closed else "arrival rate, requests/s (open loop)"
    axes[0].set(title="output tokens/s", xlabel=xlabel)
    axes[1].set(title="end-to-end latency p50 (ms)", xlabel=xlabel)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return _save(fig, path, plt)


def plot_acceptance(path: Path, levels: Sequence[dict[str, Any]]) -> Path:
    """Left: P(accept) by draft position (derived from streamed rounds); right: mean accepted per round."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    bars: dict[str, float] = {}
    for level in levels:
        for mode, s in level["modes"].items():
            by_pos = {int(k): v for k, v in s["acceptance_by_position"].items()}
            if by_pos:
                axes[0].plot(list(by_pos), list(by_pos.values()), marker="o", label=f"{mode} {_level_label(level)}")
            bars.setdefault(mode, s["mean_accepted_per_round"])
    axes[0].set(title="acceptance by draft position", xlabel="position in round", ylabel="P(accepted)", ylim=(0, 1.05))
    axes[0].grid(alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize="small")
    names = list(bars)
    axes[1].bar(names, [0.0 if math.isnan(bars[m]) else bars[m] for m in names])
    axes[1].set(title=f"mean accepted draft tokens per round ({_level_label(levels[0])})")
    return _save(fig, path, plt)


def _save(fig: Any, path: Path, plt: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(out_dir: Path, levels: Sequence[dict[str, Any]]) -> list[Path]:
    return [
        plot_latency_cdfs(out_dir / "latency_cdf.png", levels),
        plot_throughput(out_dir / "throughput.png", levels),
        plot_acceptance(out_dir / "acceptance.png", levels),
    ]

"""Eval output: the paper-style table, the JSON file and the rejection-analysis PNG. No gRPC here."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calispec_tools.bench.report import _pyplot, _save, cell, jsonable

SCHEMA = "calispec_tools.eval/1"
LN10 = math.log(10.0)


def _ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


def summarize_variant(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r["stats"]]
    keys = ("drafted", "accepted", "rescued", "rounds", "emitted", "rejections", "withheld_rescues")
    total = {k: sum(r["stats"].get(k, 0) for r in ok) for k in keys}
    total_ms = sum(r["stats"]["total_ms"] for r in ok)
    kinds = sorted({r["kind"] for r in rows})
    return {
        "tasks": len(rows),
        "errors": sum(r["error"] is not None for r in rows),
        "error_codes": dict(Counter(r["error"] for r in rows if r["error"] is not None)),  # gRPC status names
        "accuracy": _ratio(sum(r["correct"] for r in rows), len(rows)),
        "accuracy_by_kind": {
            k: _ratio(sum(r["correct"] for r in rows if r["kind"] == k), sum(r["kind"] == k for r in rows))
            for k in kinds
        },
        "acceptance_rate": _ratio(total["accepted"], total["drafted"]),
        "mean_accepted_per_round": _ratio(total["accepted"], total["rounds"]),
        "tokens_per_round": _ratio(total["emitted"], total["rounds"]),
        "rescued": total["rescued"],
        "withheld": total["withheld_rescues"],  # rescues the meaning guard refused
        "rejections": total["rejections"],  # rejection events: the rescued ones too
        # rejections that ended a round (not rescued): what CSD's "fewer rejections" counts against sd's
        "round_ending_rejections": total["rejections"] - total["rescued"],
        "output_tokens": total["emitted"],
        "server_ms": total_ms,
        "tokens_per_s": _ratio(total["emitted"], total_ms / 1000),
    }


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant, in first-seen order; speedup = tokens/s (server time) ÷ ar's, so lossy modes that
    emit a different number of tokens are compared per token."""
    labels = list(dict.fromkeys(r["variant"] for r in rows))
    out = {label: summarize_variant([r for r in rows if r["variant"] == label]) for label in labels}
    base = out.get("ar", {}).get("tokens_per_s", math.nan)
    for s in out.values():
        s["speedup_vs_ar"] = _ratio(s["tokens_per_s"], base) if not math.isnan(base) else math.nan
    return out


def format_table(summary: dict[str, dict[str, Any]]) -> str:
    kinds = sorted({k for s in summary.values() for k in s["accuracy_by_kind"]})
    head = ["variant".ljust(22), "accuracy", *[f"{k:>8}" for k in kinds]]
    head += ["accept", "acc/rnd", "rej-end", "rescued", "withheld", "tok/s", "×ar"]
    lines = ["  ".join(head)]
    for label, s in summary.items():
        cells = [
            label.ljust(22), cell(s["accuracy"], ".1%").rjust(8),
            *[cell(s["accuracy_by_kind"][k], ".1%").rjust(8) for k in kinds],
            cell(s["acceptance_rate"], ".1%").rjust(6), cell(s["mean_accepted_per_round"], ".2f").rjust(7),
            str(s["round_ending_rejections"]).rjust(7), str(s["rescued"]).rjust(7), str(s["withheld"]).rjust(8),
            cell(s["tokens_per_s"], ".1f").rjust(5),
            cell(s["speedup_vs_ar"], ".2f") + "×",
        ]  # fmt: skip
        lines.append("  ".join(cells))
    for label, s in summary.items():  # a failed request counts as a wrong answer: say so, and why it failed
        if s.get("errors"):
            codes = ", ".join(f"{code} ×{n}" for code, n in s["error_codes"].items())
            lines.append(f"{label}: {s['errors']} of {s['tasks']} requests failed ({codes}); counted as wrong answers")
    return "\n".join(lines)


def _pair_name(p: dict[str, Any]) -> str:
    return f"{p.get('draft_text', p['draft_token_id'])!r}→{p.get('target_text', p['target_token_id'])!r}"


def format_rejections(analysis: dict[str, Any]) -> str:
    top = ", ".join(f"{_pair_name(p)} ×{p['count']}" for p in analysis["top_pairs"][:5])
    text = (
        f"rejections in this run: {analysis['events']} events over {analysis['distinct_pairs']} pairs; "
        f"top 20% of pairs cover {cell(analysis['top20_share'], '.1%')}\n  most frequent: {top or '-'}"
    )
    if table := analysis.get("memory_table"):
        text += (
            f"\nthe memory table after it: {table['events']} events over {table['distinct_pairs']} pairs; "
            f"top 20% of pairs cover {cell(table['top20_share'], '.1%')}"
        )
    return text


def write_json(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(jsonable({"schema": SCHEMA, **doc}), indent=1, allow_nan=False) + "\n")
    return path


def plot_rejections(path: Path, analysis: dict[str, Any]) -> Path:
    """Left: coverage curve (with the paper's 20% mark); right: counts of the most frequent pairs."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    curve = analysis["coverage_curve"]
    axes[0].plot([p["pair_share"] * 100 for p in curve], [p["event_share"] * 100 for p in curve])
    axes[0].axvline(20, color="grey", linestyle="--", linewidth=0.8)
    axes[0].set(title="rejection coverage", xlabel="top x% of pairs", ylabel="% of rejection events", ylim=(0, 101))
    axes[0].grid(alpha=0.3)
    top = analysis["top_pairs"][:15]
    names = [_pair_name(p) for p in top]
    axes[1].barh(names[::-1], [p["count"] for p in top][::-1])
    axes[1].set(title="most frequent rejected pairs (draft→target)", xlabel="count")
    return _save(fig, path, plt)


# --- probability-ratio spread (calispec_tools/eval/ratios.py) ------------------------------------------


def format_ratios(ratios: dict[str, Any], top: int = 5) -> str:
    """One line overall, then the top pairs: count, log10 ratio range and median, share passing the gate."""
    overall = ratios["overall_log_ratio"]
    if overall is None:
        return f"probability ratios: no rejection events over {ratios.get('prompts', '?')} prompts"
    lines = [
        f"probability ratio p(draft)/p(target), log10 (gate at {math.log10(ratios['tau']):g}): "
        f"{ratios['events']} events, {ratios['distinct_pairs']} pairs, range "
        f"[{overall['min'] / LN10:.2f}, {overall['max'] / LN10:.2f}], "
        f"{cell(ratios['overall_gate_pass_share'], '.1%')} pass the gate"
    ]
    for p in ratios["top_pairs"][:top]:
        s = p["log_ratio"]
        lines.append(
            f"  #{p['rank']} {_pair_name(p)} ×{p['count']}: [{s['min'] / LN10:.2f}, {s['max'] / LN10:.2f}] "
            f"median {s['q50'] / LN10:.2f}, gate pass {p['gate_pass_share']:.0%}"
        )
    return "\n".join(lines)


def _hboxplot(ax: Any, values: list[list[float]]) -> None:
    try:  # matplotlib >= 3.10; `vert` is deprecated there, but the extra allows 3.8
        ax.boxplot(values, orientation="horizontal", widths=0.6, showfliers=False)
    except TypeError:
        ax.boxplot(values, vert=False, widths=0.6, showfliers=False)


def plot_ratios(path: Path, ratios: dict[str, Any], top: int = 15) -> Path:
    """Per top pair (most frequent at the top): a box of log10 p(draft)/p(target) with every event as a dot,
    and the SCG gate log10 τ as a dashed line; a pair spread across the line is context-dependent."""
    plt = _pyplot()
    pairs = ratios["top_pairs"][:top][::-1]
    fig, ax = plt.subplots(figsize=(10, max(3.0, 0.45 * len(pairs) + 1.5)))
    values = [[v / LN10 for v in p["log_ratios"]] for p in pairs]
    if pairs:
        _hboxplot(ax, values)
        for i, vals in enumerate(values, start=1):
            ax.scatter(vals, [i] * len(vals), s=10, alpha=0.6, color="tab:blue", zorder=3)
        ax.set_yticks(range(1, len(pairs) + 1), [f"{_pair_name(p)} ×{p['count']}" for p in pairs])
    gate = math.log10(ratios["tau"])
    ax.axvline(gate, color="tab:red", linestyle="--", linewidth=1, label=f"gate τ={ratios['tau']:g}")
    ax.set(title="target probability ratio of the most frequent rejected pairs",
           xlabel="log10 p_target(draft) / p_target(target)")  # fmt: skip
    ax.legend(loc="lower left")
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path, plt)


# --- calibration study (calispec_tools/eval/calibration.py) ---------------------------------------------

PAPER_TOP20_SHARE = 0.69  # the paper's rejection analysis: the top 20% of pairs cover ~69% of rejections


def format_study(study: dict[str, dict[str, Any]]) -> str:
    """The paper-style table: per calibration and mode, accuracy, acceptance, accepted length, rejection events
    and those that ended a round (rej-end: not rescued), rescues and speed vs the same stack's ar."""
    head = ["calibration".ljust(11), "variant".ljust(20), "accuracy", "accept", "acc/rnd", "rejections", "rej-end",
            "rescued", "rescue%", "withheld", "  ×ar"]  # fmt: skip
    lines = ["  ".join(head)]
    for label, per_variant in study.items():
        for variant, s in per_variant.items():
            cells = [
                label.ljust(11), variant.ljust(20), cell(s["accuracy"], ".1%").rjust(8),
                cell(s["acceptance_rate"], ".1%").rjust(6), cell(s["mean_accepted_per_round"], ".2f").rjust(7),
                str(s["rejections"]).rjust(10), str(s["round_ending_rejections"]).rjust(7), str(s["rescued"]).rjust(7),
                cell(s["rescue_rate"], ".1%").rjust(7),
                str(s["withheld"]).rjust(8), (cell(s["speedup_vs_ar"], ".2f") + "×").rjust(5),
            ]  # fmt: skip
            lines.append("  ".join(cells))
    return "\n".join(lines)


def format_concentration(calibration: dict[str, dict[str, Any]]) -> str:
    """Top-20% share of the memory right after calibrating and after the tasks, beside the paper's."""
    lines = [f"rejection concentration: share of events held by the top 20% of pairs (paper: ~{PAPER_TOP20_SHARE:.0%})"]
    for label, info in calibration.items():
        before, after = info["before"], info["after"]
        lines.append(
            f"  {label:<8} calibrated: {before['events']:>7} events / {before['distinct_pairs']:>6} pairs, "
            f"top 20% {cell(before['top20_share'], '.1%'):>6}   after the tasks: {after['events']:>7} / "
            f"{after['distinct_pairs']:>6}, top 20% {cell(after['top20_share'], '.1%'):>6}"
        )
        lines += [
            f"           {note}"
            for note in (_dropped(before, "calibrated"), _dropped(after, "after the tasks"))
            if note
        ]
    return "\n".join(lines)


def _dropped(read: dict[str, Any], when: str) -> str:
    """Recorded events the memory no longer holds (its caps evicted them), when there are any."""
    dropped = read.get("dropped_events", 0)
    if not dropped:
        return ""
    caps = read.get("caps", {})
    return (
        f"{when}: {dropped} of {read['recorded_events']} recorded events dropped by the memory's caps "
        f"(<= {caps.get('max_pairs_per_draft', '?')} targets per draft token, <= {caps.get('max_pairs', '?')} pairs"
        f"{', decay on' if caps.get('half_life_s') else ''})"
    )


def plot_concentration(path: Path, calibration: dict[str, dict[str, Any]]) -> Path:
    """Coverage curves per calibration (after calibrating: solid; after the tasks: dashed) and the paper's point."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for label, info in calibration.items():
        for when, style in (("before", "-"), ("after", "--")):
            curve = info[when]["coverage_curve"]
            if curve:
                xs, ys = [p["pair_share"] * 100 for p in curve], [p["event_share"] * 100 for p in curve]
                ax.plot(xs, ys, style, label=f"{label} ({'calibrated' if when == 'before' else 'after tasks'})")
    ax.scatter([20], [PAPER_TOP20_SHARE * 100], color="black", zorder=3, label="paper: top 20% → 69%")
    ax.set(title="rejection concentration", xlabel="top x% of pairs", ylabel="% of rejection events", ylim=(0, 101))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path, plt)

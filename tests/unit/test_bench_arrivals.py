"""Open-loop arrivals: seeded gamma/Poisson gaps have the stated mean and spread."""

from __future__ import annotations

import itertools
import statistics

import pytest

from calispec_tools.bench.arrivals import arrival_times, gamma_gaps
from calispec_tools.bench.openai_client import extra_body
from calispec_tools.bench.prompts import builtin_sets, load_jsonl, load_prompts
from calispec_tools.bench.runner import LoadConfig, Plan


def test_poisson_mean_gap_is_one_over_rate() -> None:
    # 20,000 exponential gaps: the sample mean's standard error is 1/(rate*sqrt(n)) ≈ 0.7%; allow 3%
    gaps = list(itertools.islice(gamma_gaps(rate=4.0, shape=1.0, seed=7), 20_000))
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.03)
    # exponential: standard deviation equals the mean (coefficient of variation 1)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.05)


def test_burstiness_keeps_the_mean_and_widens_the_spread() -> None:
    gaps = list(itertools.islice(gamma_gaps(rate=2.0, shape=0.25, seed=3), 20_000))
    assert statistics.fmean(gaps) == pytest.approx(0.5, rel=0.06)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(2.0, rel=0.1)  # CV = 1/sqrt(shape)


def test_arrival_times_are_seeded_and_start_at_zero() -> None:
    a = arrival_times(1.0, 50, seed=11)
    assert a == arrival_times(1.0, 50, seed=11)
    assert a != arrival_times(1.0, 50, seed=12)
    assert a[0] == 0.0 and all(x <= y for x, y in itertools.pairwise(a))
    with pytest.raises(ValueError):
        next(gamma_gaps(rate=0.0))


def test_builtin_prompt_sets_load(tmp_path) -> None:
    assert {"code", "math", "prose"} <= set(builtin_sets())
    prompts = load_prompts("code,math,prose")
    assert len(prompts) >= 36 and all(p.text for p in prompts)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt key"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        load_jsonl(bad)


def test_plan_interleaves_modes_per_slot() -> None:
    prompts = load_prompts("math")[:2]
    plan = Plan(prompts, LoadConfig(modes=("ar", "sd", "csd"), max_new_tokens=8))
    assert [plan.mode(s) for s in range(6)] == ["ar", "sd", "csd"] * 2
    assert [plan.prompt_index(s) for s in range(7)] == [0, 0, 0, 1, 1, 1, 0]  # every mode meets every prompt
    assert plan.params(4)["max_new_tokens"] == 8 and plan.new_record(3).gamma == 0


def test_ignore_eos_reaches_every_request_on_both_transports() -> None:
    """`calispec bench --ignore-eos`: requests of a fixed length (the SDK's keyword, the HTTP API's extra field)."""
    prompts = load_prompts("math")[:1]
    plan = Plan(prompts, LoadConfig(modes=("ar", "csd"), max_new_tokens=8, ignore_eos=True))
    assert all(plan.params(slot)["ignore_eos"] for slot in range(2))
    assert extra_body(plan.params(1))["ignore_eos"] is True
    assert "ignore_eos" not in extra_body(Plan(prompts, LoadConfig(max_new_tokens=8)).params(0))

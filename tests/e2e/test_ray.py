"""Calispec on a local Ray cluster, inside a network namespace the test makes (loopback only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TinyPair
from tests.e2e.netns import can_unshare, run_scenario

SCENARIO = Path(__file__).with_name("ray_scenario.py")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not can_unshare(), reason="needs `unshare -n` (root or user namespaces) and `ip`")
def test_ray_up_scale_down(tiny_pair: TinyPair) -> None:
    pytest.importorskip("ray", reason="`make test-slow` installs the ray extra")
    result = run_scenario(SCENARIO, [str(tiny_pair.draft), str(tiny_pair.target)], prefix="cr-")
    assert len(result["picks"]) == 2 and all(result["events"].values())
    assert result["seeded_events"] == 10  # the calibration, in the pair's namespace before any request
    assert result["memory_events"] == result["seeded_events"] + sum(result["events"].values())

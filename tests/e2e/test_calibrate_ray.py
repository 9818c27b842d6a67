"""`calispec calibrate --ray`: a local Ray cluster in a network namespace the test makes (loopback only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TinyPair
from tests.e2e.netns import can_unshare, run_scenario

SCENARIO = Path(__file__).with_name("calibrate_ray_scenario.py")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not can_unshare(), reason="needs `unshare -n` (root or user namespaces) and `ip`")
def test_calibrate_on_ray_writes_through_the_memory_service(tiny_pair: TinyPair) -> None:
    pytest.importorskip("ray", reason="`make test-slow` installs the ray extra")
    result = run_scenario(SCENARIO, [str(tiny_pair.draft), str(tiny_pair.target)], prefix="cc-")
    assert result["events"] > 0 and len(result["workers"]) == 2

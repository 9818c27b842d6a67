"""`calispec bench compare`'s load level against a running coordinator (tiny pair): what it streams adds up."""

from __future__ import annotations

import pytest

from calispec_tools.bench.compare import CompareConfig, load_level
from tests.conftest import TinyPair
from tests.service.conftest import ModelServices, start_coordinator


@pytest.mark.parametrize("mode", ["ar", "sd"])
def test_a_load_level_counts_every_streamed_token_and_its_full_concurrency_part(
    model_services: ModelServices, tiny_pair: TinyPair, mode: str
) -> None:
    server, coordinator = start_coordinator(model_services, tiny_pair.target)
    try:
        prompts = ["a b c", "d e f g", "h i"]
        config = CompareConfig(prompts, max_new_tokens=12, gamma=3, concurrency=[2], load_requests=5)
        level = load_level(coordinator.address, mode, 2, config)
    finally:
        server.stop(None)
    assert level["requests"] == 5
    assert 5 <= level["tokens"] <= 5 * 12  # every request streamed at least one token, none past its limit
    assert 0 < level["full_concurrency_s"] <= level["seconds"]
    full_tokens = level["full_concurrency_tokens_per_s"] * level["full_concurrency_s"]
    assert 0 < round(full_tokens) <= level["tokens"]
    assert level["max_batch"] >= 1
    assert (level["acceptance"] == level["acceptance"]) == (mode == "sd")  # NaN without drafting

"""The coordinator refuses a draft/target pair whose tokenizers differ (token ids would not mean the same)."""

from __future__ import annotations

import copy

import pytest

from calispec_core.errors import FailedPrecondition
from calispec_core.modeling import ModelRunner, ModelSpec, tokenizer_fingerprint
from calispec_tools.models.tiny import build_tokenizer
from coordinator.config import CoordinatorConfig
from coordinator.server import create_server as create_coordinator
from draft_service.config import DraftConfig
from draft_service.server import create_server as create_draft
from target_service.config import TargetConfig
from target_service.server import create_server as create_target
from tests.conftest import TinyPair


def test_two_tiny_tokenizers_that_differ_have_different_fingerprints() -> None:
    same, other = build_tokenizer(), build_tokenizer()
    assert tokenizer_fingerprint(same) == tokenizer_fingerprint(build_tokenizer())
    other.add_tokens(["<|not-in-the-target|>"])
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(same)


def test_coordinator_refuses_a_pair_with_different_tokenizers(
    tiny_pair: TinyPair, draft_runner: ModelRunner, target_runner: ModelRunner
) -> None:
    other = build_tokenizer()
    other.add_tokens(["<|not-in-the-target|>"])
    mismatched = copy.copy(draft_runner)  # same weights; reports the other tokenizer's fingerprint
    mismatched.tokenizer = other
    mismatched.fingerprint = tokenizer_fingerprint(other)
    draft, draft_port = create_draft(DraftConfig(ModelSpec(tiny_pair.draft), port=0), runner=mismatched)
    target, target_port, _ = create_target(TargetConfig(ModelSpec(tiny_pair.target), port=0), runner=target_runner)
    draft.start()
    target.start()
    try:
        config = CoordinatorConfig(
            draft_address=f"127.0.0.1:{draft_port}",
            target_addresses=(f"127.0.0.1:{target_port}",),
            tokenizer=tiny_pair.target,
            port=0,
        )
        with pytest.raises(FailedPrecondition, match="use different tokenizers"):
            create_coordinator(config)
    finally:
        for server in (target, draft):
            server.stop(None)

"""`calispec up --tls`: the four services as subprocesses over mutual TLS, a client with a key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from calispec.client import CalispecClient, CalispecRpcError
from calispec_tools.certs import make_dev_certs
from calispec_tools.cli_auth import add_api_key
from calispec_tools.memory_reads import wait_for_events
from calispec_tools.stack import LocalStack
from tests.conftest import TinyPair
from tests.e2e.test_stack import stack_config


@pytest.mark.slow
def test_the_local_stack_serves_over_mutual_tls_with_a_key(tiny_pair: TinyPair, tmp_path: Path) -> None:
    certs = make_dev_certs(tmp_path / "tls")
    keys = tmp_path / "api-keys"
    key = add_api_key(keys, "dev")
    config = dataclasses.replace(
        stack_config(tmp_path, tiny_pair.draft, tiny_pair.target), tls_dir=certs.directory, api_keys_file=keys
    )
    with LocalStack(config) as stack:
        with CalispecClient(stack.coordinator_address, timeout=60, token=key, tls_ca=certs.ca) as client:
            # a fixed γ: adaptive γ may choose target-only rounds (no rejections) when the host measures slow drafts
            result = client.generate("zebra quantum xylophone", max_new_tokens=16, mode="sd", num_speculative_tokens=4)
        assert result.stats.emitted == 16 and result.stats.rejections > 0
        with (
            CalispecClient(stack.coordinator_address, timeout=60, tls_ca=certs.ca) as anonymous,
            pytest.raises(CalispecRpcError, match="UNAUTHENTICATED"),
        ):
            anonymous.generate("hello", max_new_tokens=1)
        # the target (verifier) shipped its rejection events to memory over mutual TLS
        memory = stack.memory_address
        events = wait_for_events(memory, stack.memory_namespace, result.stats.rejections, tls=certs.tls("client"))
        assert events >= result.stats.rejections

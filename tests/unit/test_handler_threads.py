"""A model service's gRPC pool holds a whole batch's calls (each row holds a handler thread while its batch runs)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch


@pytest.mark.parametrize(("workers", "batch", "threads"), [(16, 8, 16), (16, 16, 24), (16, 32, 40), (64, 32, 64)])
def test_a_model_services_pool_holds_a_whole_batch_and_the_other_calls(workers: int, batch: int, threads: int) -> None:
    """Each row of a batch holds a handler thread: 16 threads never let `--max-batch-size 32` batch more than 16
    rows (found by probing)."""
    from calispec_core.grpc_server import handler_threads

    assert handler_threads(workers, batch) == threads


@pytest.mark.parametrize("service", ["draft_service", "target_service"])
def test_both_model_services_size_their_pool_so(service: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The servers pass handler_threads' count (the arithmetic above alone would pass with either left at 16)."""
    import importlib

    from calispec_core.modeling import ModelSpec

    server_module = importlib.import_module(f"{service}.server")
    config_module = importlib.import_module(f"{service}.config")
    config_class = next(v for k, v in vars(config_module).items() if k.endswith("Config") and k != "TlsConfig")
    config = config_class(ModelSpec(Path("m")), max_batch_size=32, measure_forward_costs=False, session_idle_ttl_s=0)
    if service == "target_service":
        config = replace(config, meaning_guard=False)  # its keys need a tokenizer
    seen: dict[str, int] = {}

    class Stop(Exception):
        pass

    def create_grpc_server(*args: object, max_workers: int, **kwargs: object) -> None:
        seen["max_workers"] = max_workers
        raise Stop

    monkeypatch.setattr(server_module, "create_grpc_server", create_grpc_server)
    runner = SimpleNamespace(vocab_size=8, max_context=64, device=torch.device("cpu"), eos_token_ids=(0,))
    with pytest.raises(Stop):
        server_module.create_server(config, runner)
    assert seen["max_workers"] == 40

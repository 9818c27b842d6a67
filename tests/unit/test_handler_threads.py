"""A model service's gRPC pool holds a whole batch's calls (each row holds a handler thread while its batch runs)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(("workers", "batch", "threads"), [(16, 8, 16), (16, 16, 24), (16, 32, 40), (64, 32, 64)])
def test_a_model_services_pool_holds_a_whole_batch_and_the_other_calls(workers: int, batch: int, threads: int) -> None:
    """Each row of a batch holds a handler thread: 16 threads never let `--max-batch-size 32` batch more than 16
    rows (found by probing)."""
    from calispec_core.grpc_server import handler_threads

    assert handler_threads(workers, batch) == threads

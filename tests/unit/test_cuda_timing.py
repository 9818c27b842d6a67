"""On CUDA a forward returns before its kernels finish: every timed forward phase waits for the device, or
the services report launch times (the cost model's draft steps, a round's overhead) and the verify phase
absorbs the GPU's work (found by review in wave 27). CPU-only here: the waits are recorded, not timed."""

from __future__ import annotations

import pytest
import torch

import draft_service.proposer as proposer_module
import target_service.engine as engine_module
from calispec_core import modeling
from calispec_core.modeling import ModelRunner
from calispec_core.sampling import SamplingConfig
from calispec_core.timing import Stopwatch
from draft_service.proposer import Proposer
from target_service.engine import RescueConfig, TargetEngine
from target_service.pair_table import PairTable
from target_service.verifier import Mode


def test_wait_for_synchronizes_cuda_only(monkeypatch) -> None:
    synced: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "synchronize", synced.append)
    modeling.wait_for(torch.device("cpu"))
    modeling.wait_for(torch.device("cuda", 0))
    assert synced == [torch.device("cuda", 0)]


def _recording(monkeypatch, *modules) -> list[str]:
    """The device type of each wait the modules make."""
    waits: list[str] = []
    for module in modules:
        monkeypatch.setattr(module, "wait_for", lambda device: waits.append(device.type))
    return waits


@pytest.mark.parametrize("ride", [0, 3], ids=["prefilled", "riding"])
def test_the_target_waits_inside_its_prefill_and_verify_forwards(
    target_runner: ModelRunner, monkeypatch, ride: int
) -> None:
    """A prompt that prefills on its own waits for its forward there; a riding one computes nothing there (nothing
    to wait for: on CUDA a wait would only stall the call behind other sessions' forwards) and rides in the round's."""
    waits = _recording(monkeypatch, engine_module, modeling)
    engine = TargetEngine(target_runner, 4, PairTable(target_runner.vocab_size), ride_prefill_tokens=ride)
    try:
        engine.prefill("s", [1, 2, 3], SamplingConfig(), RescueConfig(Mode.SD), Stopwatch())
        prefill_waits = [] if ride else ["cpu"]
        assert waits == prefill_waits
        engine.verify("s", [5, 6], None, Stopwatch())
        assert waits == [*prefill_waits, "cpu"]
    finally:
        engine.stop()


@pytest.mark.parametrize("ride", [0, 3], ids=["prefilled", "riding"])
def test_the_draft_waits_inside_its_prefill_and_every_step(draft_runner: ModelRunner, monkeypatch, ride: int) -> None:
    waits = _recording(monkeypatch, proposer_module, modeling)
    proposer = Proposer(draft_runner, max_sessions=2, ride_prefill_tokens=ride)
    try:
        proposer.prefill("s", [1, 2, 3], SamplingConfig(), Stopwatch())
        assert len(waits) == (0 if ride else 1)  # a prefill that computed waits for its forward
        proposal = proposer.propose("s", 3, None, [], Stopwatch())
        assert len(waits) == (0 if ride else 1) + len(proposal.token_ids)  # then one per drafted token
    finally:
        proposer.stop()

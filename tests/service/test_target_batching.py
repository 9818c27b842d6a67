"""Concurrent Verify calls share one batched forward, and greedy output stays exact."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from calispec.v1 import common_pb2, target_pb2, target_pb2_grpc
from calispec_core.grpc_server import make_channel
from calispec_core.modeling import ModelRunner, ModelSpec
from target_service.config import TargetConfig
from target_service.server import create_server
from tests.conftest import TinyPair
from tests.helpers import reference_greedy, wait_until

PROMPTS = [[5, 17, 42, 8, 99], [7], [100, 101, 102], [3, 1, 4, 1, 5, 9, 2, 6]]
ROUNDS = 4


def test_batched_rounds_keep_every_session_exact(tiny_pair: TinyPair, target_runner: ModelRunner) -> None:
    config = TargetConfig(model=ModelSpec(tiny_pair.target, dtype="float32"), port=0, max_batch_size=8)
    server, port, runtime = create_server(config, runner=target_runner)
    scheduler = runtime.engine.scheduler
    step, first_entered, release = scheduler._step, threading.Event(), threading.Event()

    def gated(rows: Sequence) -> list:  # the first batch waits until every other session has queued
        if not first_entered.is_set():
            first_entered.set()
            release.wait(timeout=60)
        return step(rows)

    scheduler._step = gated
    server.start()
    truths = [reference_greedy(target_runner, p, ROUNDS * 4) for p in PROMPTS]
    emitted: list[list[int]] = [[] for _ in PROMPTS]
    batch_sizes: list[list[int]] = [[] for _ in PROMPTS]
    batch_tokens: list[list[int]] = [[] for _ in PROMPTS]
    try:
        with make_channel(f"127.0.0.1:{port}") as channel:
            stub = target_pb2_grpc.TargetServiceStub(channel)
            for i, prompt in enumerate(PROMPTS):
                stub.Prefill(target_pb2.TargetPrefillRequest(session_id=f"s{i}", token_ids=prompt,
                                                             mode=common_pb2.MODE_SD))  # fmt: skip

            def round_for(i: int, r: int) -> None:
                done = len(emitted[i])
                draft = truths[i][done : done + 3]
                if (i + r) % 2:  # every other round a wrong second token: a recovery, not a bonus
                    draft[1] = (draft[1] + 1) % target_runner.vocab_size
                resp = stub.Verify(target_pb2.VerifyRequest(session_id=f"s{i}", draft_token_ids=draft), timeout=60)
                emitted[i] += [*draft[: resp.accepted_count], resp.next_token_id]
                batch_sizes[i].append(resp.batch_size)
                batch_tokens[i].append(resp.batch_tokens)

            for r in range(ROUNDS):
                threads = [threading.Thread(target=round_for, args=(i, r)) for i in range(len(PROMPTS))]
                threads[0].start()
                if r == 0:
                    assert first_entered.wait(timeout=60)
                for t in threads[1:]:
                    t.start()
                if r == 0:
                    wait_until(lambda: scheduler._queue.qsize() == len(PROMPTS) - 1)
                    release.set()
                for t in threads:
                    t.join(timeout=60)
    finally:
        server.stop(None)
        runtime.stop()
    assert batch_sizes[0][0] == 1 and all(sizes[0] == len(PROMPTS) - 1 for sizes in batch_sizes[1:])
    # each row: its pending tokens (the whole prompt in a session's first round: its prefill rides there) and 3
    # drafts; what the cost model prices a batch by
    riding = [len(prompt) + 3 for prompt in PROMPTS]
    assert batch_tokens[0][0] == riding[0] and all(tokens[0] == sum(riding[1:]) for tokens in batch_tokens[1:])
    assert all(tokens[1] % 4 == 0 for tokens in batch_tokens)  # then 1 pending + 3 drafts a row
    for truth, got in zip(truths, emitted, strict=True):
        assert got == truth[: len(got)] and len(got) >= ROUNDS * 2

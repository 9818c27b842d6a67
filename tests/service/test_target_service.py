"""Target service in-process on port 0: verification over a real gRPC channel, bad input."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from calispec.v1 import common_pb2, target_pb2, target_pb2_grpc
from calispec_core.grpc_server import make_channel
from calispec_core.limits import MAX_SPECULATIVE_TOKENS
from calispec_core.modeling import ModelRunner, ModelSpec
from target_service.config import TargetConfig
from target_service.meaning_guard import meaning_keys
from target_service.server import create_server
from tests.conftest import TinyPair
from tests.helpers import reference_greedy, rpc_code

PROMPT = [5, 17, 42, 8, 99]


@pytest.fixture(scope="module")
def stub(tiny_pair: TinyPair, target_runner: ModelRunner) -> Iterator[target_pb2_grpc.TargetServiceStub]:
    config = TargetConfig(model=ModelSpec(tiny_pair.target, dtype="float32"), port=0, max_sessions=8)
    server, port, runtime = create_server(config, runner=target_runner)
    assert runtime.link is None  # no memory address: local counts only
    server.start()
    with make_channel(f"127.0.0.1:{port}") as channel:
        yield target_pb2_grpc.TargetServiceStub(channel)
    server.stop(None)
    runtime.stop()


def prefill(stub, sid: str, tokens=PROMPT, mode=common_pb2.MODE_SD, rescue=None, **sampling) -> None:
    request = target_pb2.TargetPrefillRequest(
        session_id=sid, token_ids=tokens, mode=mode, sampling=common_pb2.SamplingParams(**sampling)
    )
    if rescue is not None:
        request.rescue.CopyFrom(rescue)
    stub.Prefill(request)


def verify(stub, sid: str, draft: list[int], probs: bytes = b"", vocab: int = 0) -> target_pb2.VerifyResponse:
    return stub.Verify(
        target_pb2.VerifyRequest(session_id=sid, draft_token_ids=draft, draft_probs=probs, draft_vocab_size=vocab)
    )


def close(stub, sid: str) -> None:
    stub.Close(target_pb2.TargetCloseRequest(session_id=sid))


def test_correct_drafts_are_all_accepted_with_a_bonus(stub, target_runner: ModelRunner) -> None:
    truth = reference_greedy(target_runner, PROMPT, 9)
    prefill(stub, "all")
    first = verify(stub, "all", truth[:4])
    assert (first.accepted_count, first.next_token_id, first.next_is_bonus) == (4, truth[4], True)
    assert first.rejections == 0
    second = verify(stub, "all", truth[5:8])  # the session continues after the bonus token
    assert (second.accepted_count, second.next_token_id) == (3, truth[8])
    close(stub, "all")


def test_first_mismatch_ends_the_round_with_the_recovered_token(stub, target_runner: ModelRunner) -> None:
    truth = reference_greedy(target_runner, PROMPT, 6)
    wrong = (truth[2] + 1) % target_runner.vocab_size
    prefill(stub, "mis")
    r = verify(stub, "mis", [truth[0], truth[1], wrong, truth[3]])
    assert (r.accepted_count, r.next_token_id, r.next_is_bonus, r.rejections) == (2, truth[2], False, 1)
    # the rejected drafts were cropped from the cache: the next step continues the true sequence
    r = verify(stub, "mis", truth[3:6])
    assert (r.accepted_count, r.next_token_id) == (3, reference_greedy(target_runner, PROMPT, 7)[6])
    close(stub, "mis")


def test_a_rescue_the_meaning_guard_refuses_is_reported_withheld(stub, target_runner: ModelRunner) -> None:
    truth = reference_greedy(target_runner, PROMPT, 1)
    keys = meaning_keys(target_runner.tokenizer, target_runner.vocab_size)
    digits = target_runner.tokenizer.convert_tokens_to_ids(["1", "2"])
    wrong = next(d for d in digits if keys[d] != keys[truth[0]])  # a changed numeral: never rescued
    rescue = common_pb2.RescueParams(tau=1e-9, lambda_=0)
    for sid in ("w1", "w2"):
        prefill(stub, sid, mode=common_pb2.MODE_CSD, rescue=rescue)
    first = verify(stub, "w1", [wrong])  # counts the pair once: count 1 > λ = 0 afterwards
    assert first.withheld_rescues == 0  # not frequent yet: the paper's rule refuses it too
    second = verify(stub, "w2", [wrong])
    assert list(second.rescued_positions) == [] and second.accepted_count == 0
    assert second.withheld_rescues == 1 and second.next_token_id == truth[0]
    for sid in ("w1", "w2"):
        close(stub, sid)


def test_empty_draft_is_one_plain_decoding_step(stub, target_runner: ModelRunner) -> None:
    prefill(stub, "ar", mode=common_pb2.MODE_AR)
    tokens = [verify(stub, "ar", []).next_token_id for _ in range(5)]
    assert tokens == reference_greedy(target_runner, PROMPT, 5)
    close(stub, "ar")


def test_csd_rescues_a_repeated_pair_with_permissive_thresholds(stub, target_runner: ModelRunner) -> None:
    truth = reference_greedy(target_runner, PROMPT, 3)
    wrong = (truth[0] + 1) % target_runner.vocab_size
    keys = meaning_keys(target_runner.tokenizer, target_runner.vocab_size)
    assert keys[wrong] == keys[truth[0]]  # a pair the meaning guard (on by default) lets through
    rescue = common_pb2.RescueParams(tau=1e-9, lambda_=0)
    for sid in ("c1", "c2"):
        prefill(stub, sid, mode=common_pb2.MODE_CSD, rescue=rescue)
    first = verify(stub, "c1", [wrong, truth[1]])  # pair (wrong, truth[0]) seen once: count 1 > λ = 0 afterwards
    assert first.accepted_count == 0 and list(first.rescued_positions) == []
    second = verify(stub, "c2", [wrong])
    assert list(second.rescued_positions) == [0] and second.accepted_count == 1 and second.rejections == 1
    for sid in ("c1", "c2"):
        close(stub, sid)


def test_sampling_verification_needs_and_checks_draft_probs(stub, target_runner: ModelRunner) -> None:
    vocab = target_runner.vocab_size
    prefill(stub, "smp", temperature=1.0, seed=7)
    assert rpc_code(lambda: verify(stub, "smp", [1, 2])) == grpc.StatusCode.INVALID_ARGUMENT
    bad_len = np.full((2, vocab - 1), 1.0 / vocab, dtype="<f4").tobytes()
    assert rpc_code(lambda: verify(stub, "smp", [1, 2], bad_len, vocab)) == grpc.StatusCode.INVALID_ARGUMENT
    nan = np.full((2, vocab), np.nan, dtype="<f4").tobytes()
    assert rpc_code(lambda: verify(stub, "smp", [1, 2], nan, vocab)) == grpc.StatusCode.INVALID_ARGUMENT
    uniform = np.full((2, vocab), 1.0 / vocab, dtype="<f4").tobytes()
    r = verify(stub, "smp", [1, 2], uniform, vocab)
    assert 0 <= r.accepted_count <= 2 and 0 <= r.next_token_id < vocab
    close(stub, "smp")


def test_bad_input_gets_clear_statuses(stub, target_runner: ModelRunner) -> None:
    vocab = target_runner.vocab_size
    assert rpc_code(lambda: verify(stub, "ghost", [1])) == grpc.StatusCode.NOT_FOUND
    assert rpc_code(lambda: prefill(stub, "e", tokens=[])) == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc_code(lambda: prefill(stub, "v", tokens=[vocab])) == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        rpc_code(lambda: prefill(stub, "t", mode=common_pb2.MODE_CSD, rescue=common_pb2.RescueParams(tau=0.0)))
        == grpc.StatusCode.INVALID_ARGUMENT
    )
    assert rpc_code(lambda: prefill(stub, "m", mode=42)) == grpc.StatusCode.INVALID_ARGUMENT
    prefill(stub, "ok")
    assert rpc_code(lambda: verify(stub, "ok", [vocab + 5])) == grpc.StatusCode.INVALID_ARGUMENT
    too_many = [1] * (MAX_SPECULATIVE_TOKENS + 1)
    assert rpc_code(lambda: verify(stub, "ok", too_many)) == grpc.StatusCode.INVALID_ARGUMENT
    # none of that changed the session
    assert verify(stub, "ok", []).next_token_id == reference_greedy(target_runner, PROMPT, 1)[0]
    close(stub, "ok")


def test_stats_show_open_sessions_and_the_idle_ttl(stub) -> None:
    before = stub.GetStats(target_pb2.TargetStatsRequest()).sessions
    assert (before.max_sessions, before.idle_ttl_s) == (8, 120.0)
    prefill(stub, "stats-1")
    prefill(stub, "stats-2")
    assert stub.GetStats(target_pb2.TargetStatsRequest()).sessions.open_sessions == before.open_sessions + 2
    close(stub, "stats-1")
    close(stub, "stats-2")
    after = stub.GetStats(target_pb2.TargetStatsRequest())
    assert after.sessions.open_sessions == before.open_sessions
    assert after.memory_version == -1 and after.memory_pairs_skipped == 0  # no memory service: no table


def test_a_close_that_arrives_before_its_prefill_cancels_it(stub) -> None:
    """The Prefill still queued when its client gave up and closed it: the session used to open afterwards and
    hold its slot and KV cache until the idle TTL."""
    before = stub.GetStats(target_pb2.TargetStatsRequest()).sessions.open_sessions
    assert rpc_code(lambda: close(stub, "late")) == grpc.StatusCode.NOT_FOUND
    assert rpc_code(lambda: prefill(stub, "late")) == grpc.StatusCode.CANCELLED
    assert stub.GetStats(target_pb2.TargetStatsRequest()).sessions.open_sessions == before
    prefill(stub, "late")  # one Close cancels one Prefill
    close(stub, "late")


def test_cli_sets_the_session_idle_ttl() -> None:
    from target_service.__main__ import parse_config

    config, _ = parse_config(["--model", "m", "--session-idle-ttl-s", "7.5"])
    assert config.session_idle_ttl_s == 7.5
    assert parse_config(["--model", "m", "--batch-gather-ms", "2.5"])[0].batch_gather_s == 0.0025
    with pytest.raises(SystemExit):  # argparse: "--batch-gather-ms: must be >= 0 ms, got -1"
        parse_config(["--model", "m", "--batch-gather-ms", "-1"])


def test_faulty_draft_distributions_are_refused_and_change_nothing(stub, target_runner: ModelRunner) -> None:
    vocab = target_runner.vocab_size
    uniform = np.full((2, vocab), 1.0 / vocab, dtype="<f4")
    negative = uniform.copy()
    negative[0, :2] = [-0.5, 0.5 + 2.0 / vocab]  # still sums to 1
    narrower = np.full((2, vocab - 1), 1.0 / (vocab - 1), dtype="<f4")  # a distribution, but not over the vocabulary
    one_nan, one_inf = uniform.copy(), uniform.copy()
    one_nan[1, 5], one_inf[0, 7] = np.nan, np.inf
    faulty = [(negative, vocab), (np.zeros_like(uniform), vocab), (uniform * 1e30, vocab), (narrower, vocab - 1)]
    faulty += [(one_nan, vocab), (one_inf, vocab)]
    for sid in ("faulty", "twin"):
        prefill(stub, sid, mode=common_pb2.MODE_SD, temperature=1.0, seed=5)
    for probs, width in faulty:
        code = rpc_code(lambda p=probs, w=width: verify(stub, "faulty", [1, 2], p.tobytes(), w))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (probs[0, :3], width)
    outcomes = [verify(stub, sid, [1, 2], uniform.tobytes(), vocab) for sid in ("faulty", "twin")]
    fields = [(r.accepted_count, r.next_token_id, r.next_is_bonus, list(r.rescued_positions)) for r in outcomes]
    assert fields[0] == fields[1]  # the refused calls touched neither the cache nor the random stream
    for sid in ("faulty", "twin"):
        close(stub, sid)


def sparse(rows: list[tuple[list[int], list[float]]]) -> common_pb2.SparseDistributions:
    return common_pb2.SparseDistributions(
        row_sizes=[len(ids) for ids, _ in rows],
        token_ids=[t for ids, _ in rows for t in ids],
        probs=[p for _, ps in rows for p in ps],
    )


def verify_sparse(stub, sid: str, draft: list[int], q: common_pb2.SparseDistributions, dense: bytes = b""):
    request = target_pb2.VerifyRequest(session_id=sid, draft_token_ids=draft, draft_sparse_probs=q)
    if dense:
        request.draft_probs, request.draft_vocab_size = dense, len(dense) // 4 // len(draft)
    return stub.Verify(request)


def test_faulty_sparse_draft_distributions_are_refused_and_change_nothing(stub, target_runner: ModelRunner) -> None:
    vocab = target_runner.vocab_size
    good = [([1, 9], [0.25, 0.75]), ([2], [1.0])]
    faulty = {
        "a row missing": sparse(good[:1]),
        "a token outside the vocabulary": sparse([([1, vocab], [0.25, 0.75]), good[1]]),
        "a token twice": sparse([([9, 9], [0.25, 0.75]), good[1]]),
        "a row not summing to 1": sparse([([1, 9], [0.25, 0.5]), good[1]]),
        "a negative probability": sparse([([1, 9, 4], [-0.25, 0.75, 0.5]), good[1]]),
        "a NaN": sparse([([1, 9], [float("nan"), 0.75]), good[1]]),
        "an empty row": sparse([([], []), ([1, 2], [0.5, 0.5])]),
        "sizes and entries disagree": common_pb2.SparseDistributions(row_sizes=[2, 2], token_ids=[1, 2, 3], probs=[1]),
    }
    for sid in ("sparse-faulty", "sparse-twin"):
        prefill(stub, sid, mode=common_pb2.MODE_SD, temperature=1.0, seed=5)
    for what, q in faulty.items():
        code = rpc_code(lambda q=q: verify_sparse(stub, "sparse-faulty", [1, 2], q))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, what
    dense = np.full((2, vocab), 1.0 / vocab, dtype="<f4").tobytes()
    both = rpc_code(lambda: verify_sparse(stub, "sparse-faulty", [1, 2], sparse(good), dense))
    assert both == grpc.StatusCode.INVALID_ARGUMENT
    outcomes = [verify_sparse(stub, sid, [1, 2], sparse(good)) for sid in ("sparse-faulty", "sparse-twin")]
    fields = [(r.accepted_count, r.next_token_id, r.next_is_bonus) for r in outcomes]
    assert fields[0] == fields[1]  # the refused calls touched neither the cache nor the random stream
    for sid in ("sparse-faulty", "sparse-twin"):
        close(stub, sid)


def test_sparse_q_verifies_like_the_same_q_sent_dense(stub, target_runner: ModelRunner) -> None:
    vocab = target_runner.vocab_size
    rows = [([1, 9, 30], [0.2, 0.5, 0.3]), ([2, 7], [0.6, 0.4]), ([5], [1.0])]
    dense = np.zeros((3, vocab), dtype="<f4")
    for i, (ids, probs) in enumerate(rows):
        dense[i, ids] = probs
    outcomes = []
    for sid, send in (("as-sparse", lambda s: verify_sparse(stub, s, [9, 2, 5], sparse(rows))),
                      ("as-dense", lambda s: verify(stub, s, [9, 2, 5], dense.tobytes(), vocab))):  # fmt: skip
        prefill(stub, sid, mode=common_pb2.MODE_SD, temperature=1.0, seed=11)
        outcomes.append([send(sid) for _ in range(4)])
        close(stub, sid)
    fields = [[(r.accepted_count, r.next_token_id, r.next_is_bonus) for r in rounds] for rounds in outcomes]
    assert fields[0] == fields[1]  # same seed, same q: the same coins decide the same way

"""Conversions between protobuf messages and domain types, shared by the servicers and clients."""

from __future__ import annotations

from typing import Any

import numpy as np

from calispec.v1 import common_pb2
from calispec_core.generation import SessionOutput, constraint_from_wire
from calispec_core.logit_rules import rules_from_wire
from calispec_core.modeling import ModelRunner
from calispec_core.sampling import SamplingConfig
from calispec_core.sessions import SessionStats
from calispec_core.sparse_q import SparseQ
from calispec_core.timing import Stopwatch


def sampling_from_pb(msg: common_pb2.SamplingParams) -> SamplingConfig:
    return SamplingConfig(
        temperature=msg.temperature,
        top_p=msg.top_p,
        top_k=msg.top_k,
        seed=msg.seed if msg.HasField("seed") else None,
    )


def sampling_to_pb(config: SamplingConfig) -> common_pb2.SamplingParams:
    msg = common_pb2.SamplingParams(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k)
    if config.seed is not None:
        msg.seed = config.seed
    return msg


def output_from_pb(request: Any) -> SessionOutput:
    """A Prefill request's session output: the target's and the draft's carry the same three fields."""
    return SessionOutput(
        constraint_from_wire(request.constraint, request.HasField("constraint")),
        rules_from_wire(request.rules, request.HasField("rules")),
        request.output_written,
    )


def output_fields(output: SessionOutput) -> dict[str, Any]:
    """The Prefill request's fields of a session output."""
    return {
        "constraint": output.constraint.to_pb() if output.constraint is not None else None,
        "rules": output.rules.to_pb() if output.rules is not None else None,
        "output_written": output.written,
    }


def timing_to_pb(watch: Stopwatch) -> common_pb2.Timing:
    return common_pb2.Timing(
        total_ns=watch.total_ns,
        forward_ns=watch.get("forward"),
        verify_ns=watch.get("verify"),
        memory_ns=watch.get("memory"),
        prefill_ns=watch.get("prefill"),
    )


def model_info_to_pb(runner: ModelRunner) -> common_pb2.ModelInfo:
    return common_pb2.ModelInfo(
        model_id=runner.model_id,
        vocab_size=runner.vocab_size,
        tokenizer_fingerprint=runner.fingerprint,
        max_context=runner.max_context,
        dtype=runner.dtype_name,
        device=str(runner.device),
        eos_token_ids=runner.eos_token_ids,
        forward_costs=[common_pb2.ForwardCost(new_tokens=n, ms=ms) for n, ms in sorted(runner.forward_costs.items())],
        fp32_linear=runner.fp32_linear,
        logit_rules=True,  # both model services apply them (calispec_core/logit_rules.py)
    )


def session_stats_to_pb(stats: SessionStats) -> common_pb2.SessionStats:
    return common_pb2.SessionStats(
        open_sessions=stats.open_sessions,
        max_sessions=stats.max_sessions,
        idle_ttl_s=stats.idle_ttl_s,
        reaped_sessions=stats.reaped_sessions,
    )


def sparse_q_to_pb(q: SparseQ) -> common_pb2.SparseDistributions:
    return common_pb2.SparseDistributions(row_sizes=q.row_sizes, token_ids=q.token_ids.tolist(), probs=q.probs.tolist())


def sparse_q_from_pb(msg: common_pb2.SparseDistributions) -> SparseQ:
    """Decoded only: the receiver validates it against its own vocabulary (`SparseQ.validate`)."""
    return SparseQ(
        list(msg.row_sizes),
        np.array(msg.token_ids, dtype=np.int64),
        np.array(msg.probs, dtype=np.float32),
    )

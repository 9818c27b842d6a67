"""Hard limits every service enforces the same way (requests beyond them are INVALID_ARGUMENT)."""

from __future__ import annotations

import argparse
import math
import re
import struct
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

from calispec_core.errors import InvalidArgument, InvalidField, require, require_field

T = TypeVar("T")

MAX_SPECULATIVE_TOKENS = 16  # gamma; the paper uses 6
MAX_NEW_TOKENS = 8192
MAX_PROMPT_CHARS = 1_000_000
MAX_LOGPROBS = 20  # most likely tokens a request may ask for at each position (vLLM's default max_logprobs)
MAX_STOP_STRINGS = 16
HTTP_MAX_CHOICES = 16  # an OpenAI request's choices (`n` times its prompts)
MAX_STOP_STRING_CHARS = 256
MAX_LAMBDA = 2**31 - 1  # the coordinator API's int32 field
MAX_TEMPERATURE = 100.0
MAX_TOP_K = 2**31 - 1  # the public API's int32; a model service bounds it by its vocabulary as well
SEED_BOUND = 2**63  # exclusive: a seed is a non-negative int64
DEFAULT_PREFIX_CACHE_TOKENS = 8192  # here, not in prefix_cache (torch): service_cli serves the memory service too
# Prompts up to this many tokens prefill inside their session's first batched forward (calispec_core/modeling.py
# prefill_session), the length of one prefill chunk; 0: every prompt prefills on its own.
DEFAULT_RIDE_PREFILL_TOKENS = 128
MAX_CONSTRAINT_CHARS = 256 * 1024  # a structured output's schema, regex or grammar; its choices all together
MAX_CONSTRAINT_CHOICES = 1024
MAX_STATS_TOP_PAIRS = 10_000  # the memory service's GetStats.top_k (`calispec memory stats --top`)


def as_float32(value: float) -> float:
    """`value` as a float32 field of the APIs carries it: protobuf rounds to the nearest float32 (1.00000001 is
    1.0, 1e-46 is 0.0) and sends ±inf beyond float32's range."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def check_max_new_tokens(max_new_tokens: int) -> None:
    """A completion's token limit, in [1, MAX_NEW_TOKENS]."""
    require_field(
        1 <= max_new_tokens <= MAX_NEW_TOKENS,
        "max_new_tokens",
        f"must be in [1, {MAX_NEW_TOKENS}], got {max_new_tokens}",
    )


def check_logprobs(logprobs: int | None, field: str = "logprobs") -> None:
    """None (no log-probabilities) or the most likely tokens to report at each position, in [0, MAX_LOGPROBS]."""
    require_field(
        logprobs is None or 0 <= logprobs <= MAX_LOGPROBS, field, f"must be in [0, {MAX_LOGPROBS}], got {logprobs}"
    )


def check_speculative_tokens(num_speculative_tokens: int | None, field: str = "num_speculative_tokens") -> None:
    """A fixed γ in [1, MAX_SPECULATIVE_TOKENS]; None is adaptive. `field`: the name the caller's API gives γ (the
    draft's Propose calls it num_tokens)."""
    require_field(
        num_speculative_tokens is None or 1 <= num_speculative_tokens <= MAX_SPECULATIVE_TOKENS,
        field,
        f"must be in [1, {MAX_SPECULATIVE_TOKENS}], got {num_speculative_tokens}",
    )


def check_csd_thresholds(tau: float | None = None, lambda_: int | None = None) -> None:
    """CSD's τ in (0, 1] and λ in [0, MAX_LAMBDA]: for requests, server defaults and flags alike. τ reaches the
    target as a float32, where it must be in range too: 1e-46 arrives as 0.0, refused request after request (the
    refusal shows the value as sent first: that is the one its sender knows)."""
    if tau is not None:
        require_field(0.0 < tau <= 1.0, "tau", f"must be in (0, 1], got {tau}")
        require_field(as_float32(tau) > 0.0, "tau", f"must be in (0, 1], got {tau} (0.0 as the target's float32)")
    require_field(
        lambda_ is None or 0 <= lambda_ <= MAX_LAMBDA, "lambda", f"must be in [0, {MAX_LAMBDA}], got {lambda_}"
    )


def check_sampling(
    temperature: float | None = None, top_p: float | None = None, top_k: int | None = None, seed: int | None = None
) -> None:
    """The sampling parameters' ranges, for requests and flags alike (a model service also bounds top_k by its
    vocabulary, which no flag knows)."""
    require_field(
        temperature is None or 0.0 <= temperature <= MAX_TEMPERATURE,
        "temperature",
        f"must be in [0.0, {MAX_TEMPERATURE}], got {temperature}",
    )
    require_field(top_p is None or 0.0 <= top_p <= 1.0, "top_p", f"must be in [0.0, 1.0], got {top_p}")
    require_field(top_k is None or 0 <= top_k <= MAX_TOP_K, "top_k", f"must be in [0, {MAX_TOP_K}], got {top_k}")
    require_field(seed is None or 0 <= seed < SEED_BOUND, "seed", f"must be in [0, 2**63), got {seed}")


MAX_PENALTY = 2.0  # presence and frequency penalties lie in [-2, 2] (OpenAI's range)
MIN_REPETITION_PENALTY = 0.01  # a smaller one overflows float32 logits (z / penalty: +inf)
MAX_REPETITION_PENALTY = 2.0


def check_logit_rules(
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    repetition_penalty: float | None = None,
    min_p: float | None = None,
    min_tokens: int | None = None,
) -> None:
    """The scalar logit rules' ranges (calispec_core/logit_rules.py), for requests and flags alike."""
    for name, value in (("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty)):
        require_field(value is None or -MAX_PENALTY <= value <= MAX_PENALTY, name, f"must be in [-2, 2], got {value}")
    rp, low, high = repetition_penalty, MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY
    reason = f"must be in [{low}, {high}], got {rp}"  # the floor as its float32 carries it (0.0099999998)
    require_field(rp is None or as_float32(low) <= rp <= high, "repetition_penalty", reason)
    require_field(min_p is None or 0 <= min_p <= 1, "min_p", f"must be in [0, 1], got {min_p}")
    reason = f"must be in [0, {MAX_NEW_TOKENS}], got {min_tokens}"
    require_field(min_tokens is None or 0 <= min_tokens <= MAX_NEW_TOKENS, "min_tokens", reason)


def check_stop_strings(stop: Sequence[str]) -> None:
    """At most MAX_STOP_STRINGS stop strings of 1 to MAX_STOP_STRING_CHARS characters each."""
    require(len(stop) <= MAX_STOP_STRINGS, f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}")
    for s in stop:
        require(0 < len(s) <= MAX_STOP_STRING_CHARS, f"stop strings must be 1 to {MAX_STOP_STRING_CHARS} characters")


def check_stop_token_ids(stop_token_ids: Sequence[int]) -> None:
    """At most MAX_STOP_STRINGS stop token ids, each a uint32 (an id outside the vocabulary never matches)."""
    require(
        len(stop_token_ids) <= MAX_STOP_STRINGS,
        f"at most {MAX_STOP_STRINGS} stop token ids, got {len(stop_token_ids)}",
    )
    require(all(0 <= t < 2**32 for t in stop_token_ids), "stop token ids must be integers in [0, 2**32)")


def validate_prompt(prompt: str) -> None:
    """A raw prompt: 1 to MAX_PROMPT_CHARS characters, valid Unicode (a model may still encode it to no tokens)."""
    require(len(prompt) > 0, "prompt must not be empty")
    require(len(prompt) <= MAX_PROMPT_CHARS, f"prompt longer than {MAX_PROMPT_CHARS} characters")
    require_unicode(prompt, "prompt")


def require_unicode(text: str, what: str) -> None:
    """Text that UTF-8 cannot encode (a lone surrogate, which JSON's \\ud800 escapes allow) is the caller's
    error: the tokenizer would fail on it as a bug (HTTP 500)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"{what} is not valid Unicode (a lone surrogate at character {exc.start})") from None


def int_at_least(minimum: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: an int >= minimum; `why`, when given, follows the bound in the error."""
    bound = f"{minimum} {why}" if why else str(minimum)

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {bound}, got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type in "invalid int value: 'x'"
    return parse


_positive_int = int_at_least(1)
_non_negative_int = int_at_least(0)


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1."""
    return _positive_int(text)


def non_negative_int(text: str) -> int:
    """An argparse type: an int >= 0."""
    return _non_negative_int(text)


MAX_THREADS = 1024  # a service's torch threads: --threads 100000 ended in "can't start new thread", then SIGSEGV


def threads(text: str) -> int:
    """An argparse type: a number of torch threads, in [1, MAX_THREADS]."""
    return int_in_range(1, MAX_THREADS)(text)


def int_in_range(minimum: int, maximum: int) -> Callable[[str], int]:
    """An argparse type: an int in [minimum, maximum]."""

    def parse(text: str) -> int:
        value = int(text)
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be in [{minimum}, {maximum}], got {value}")
        return value

    parse.__name__ = "int"  # argparse names the type in "invalid int value: 'x'"
    return parse


def _int_checked_by(check: Callable[[int], None]) -> Callable[[str], int]:
    """An argparse type: an int that the field's `check` takes (its reason is the error: argparse names the flag)."""

    def parse(text: str) -> int:
        return flag_checked(int(text), check)

    parse.__name__ = "int"  # argparse names the type in "invalid int value: 'x'"
    return parse


gamma = _int_checked_by(check_speculative_tokens)  # an argparse type: the range every fixed γ must keep
max_new_tokens = _int_checked_by(check_max_new_tokens)  # an argparse type: the range of max_new_tokens
lambda_ = _int_checked_by(lambda value: check_csd_thresholds(lambda_=value))  # an argparse type: CSD's λ
logprobs = _int_checked_by(check_logprobs)  # an argparse type: the most likely tokens to report a position


def tau(text: str) -> float:
    """An argparse type: CSD's τ as a server default (or a tool's, sent as given), in (0, 1] as given and as the
    target's float32 gets it."""
    return flag_checked(float(text), lambda value: check_csd_thresholds(tau=value))


def flag_checked(value: T, check: Callable[[T], None]) -> T:
    """`value`, if `check` takes it; else argparse's error with the check's reason (every flag's range check)."""
    try:
        check(value)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(flag_error(exc)) from None
    return value


def flag_error(exc: InvalidArgument) -> str:
    """A refusal worded for argparse, which names the flag already: a field's reason alone (`argument --tau:
    must be in (0, 1], got 0.0`, not `argument --tau: tau must be ...`)."""
    return exc.reason if isinstance(exc, InvalidField) else str(exc)


MAX_PORT = 65535
_port = int_in_range(0, MAX_PORT)


def port(text: str) -> int:
    """An argparse type: a TCP port, 0 (a free one) to 65535; unchecked, 70000 would bind 70000 mod 2**16."""
    return _port(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # nan would slip past every comparison below
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite float > 0 (a timeout or an interval that 0 would break)."""
    value = _finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


GRPC_SCHEMES = ("unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:", "xds:")  # gRPC targets that are no HOST:PORT
NAMED_SCHEMES = ("dns:", "passthrough:")  # gRPC targets naming one HOST:PORT: SCHEME:H:P, SCHEME:///H:P, SCHEME://A/H:P
NAMESPACE_PATTERN = re.compile(r"[A-Za-z0-9._:/+-]{1,128}")  # a correction-memory namespace (a SQLite key)


def host_port(host: str, port: int) -> str:
    """HOST:PORT, an IPv6 literal in brackets ("[::1]:50053"): unbracketed, gRPC dialled port 443 (review)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def grpc_address(text: str) -> str:
    """An argparse type: a service's address for a gRPC channel (HOST:PORT, or a target gRPC names such as
    unix:PATH): not empty, no whitespace (`--address ""` made gRPC log its channel-stack failure and the call end
    as UNKNOWN), and a port in 1-65535 (`:99999` reached port 34463: gRPC wrapped it; `localhost` or `[::1]` alone
    dialled port 443, the connection refused far from the flag: found by probing)."""
    if not text or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"must be HOST:PORT, got {text!r}")
    if text.startswith(NAMED_SCHEMES):
        rest = text.partition(":")[2]
        address = rest[2:].partition("/")[2] if rest.startswith("//") else rest
    elif text.startswith(GRPC_SCHEMES):
        return text  # unix:PATH, ipv4:/ipv6: address lists: gRPC's own forms
    else:
        address = text
    host, colon, port = address.rpartition(":")
    if not (colon and _dialable_host(host)):
        # "[::1]", "::1", "::1:50050" (an IPv6 address needs brackets), ":5": gRPC dialled port 443 or failed
        raise argparse.ArgumentTypeError(f"must be HOST:PORT ([V6]:PORT; without a port gRPC dials 443), got {text!r}")
    if not _dialable_port(port):
        raise argparse.ArgumentTypeError(f"must be HOST:PORT with a port in 1-65535, got {text!r}")
    return text


def _dialable_host(host: str) -> bool:
    """A name or an IPv4 address, or an IPv6 literal in brackets (unbracketed, its colons read as a port's)."""
    if host.startswith("[") and host.endswith("]"):
        inside = host[1:-1]
        return inside != "" and not any(c in inside for c in "[]")
    return host != "" and not any(c in host for c in ":[")


def _dialable_port(text: str) -> bool:
    return text.isdigit() and 1 <= int(text) <= MAX_PORT


def dns_host_port(text: str) -> str:
    """An argparse type: a DNS name (or IPv4 address) and a port, as a resolver takes them: no scheme, no brackets
    (`dns:///h:1` or `[::1]:1` waited out the start-up timeout; `:50051` failed the start; found by review)."""
    host, sep, port = text.rpartition(":")
    plain = bool(host) and not any(c in host for c in "/[]:@") and not any(c.isspace() for c in text)
    if not (sep and plain and _dialable_port(port)):
        raise argparse.ArgumentTypeError(f"must be HOST:PORT (a DNS name and a port in 1-65535), got {text!r}")
    return text


def namespace(text: str) -> str:
    """An argparse type: a correction-memory namespace the memory service takes (a target given another served
    on local counts for good, every Watch refused, without a word; found by probing)."""
    if NAMESPACE_PATTERN.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(f"must be 1-128 characters of [A-Za-z0-9._:/+-], got {text[:140]!r}")
    return text


# The longest wait a service's flag may set (~115 days): threading's waits overflow past ~9.2e9 s, and a background
# thread (reaper, batcher, memory flush, DNS refresh) died of it, leaving the service up without its work (found by
# probing: --batch-gather-ms 1e300 hung every request; --rpc-timeout 1e10 blamed the draft at start-up).
MAX_WAIT_S = 1e7


def seconds(text: str) -> float:
    """An argparse type: a duration in seconds, > 0 and at most MAX_WAIT_S."""
    return _at_most(positive_float(text), MAX_WAIT_S, text)


def seconds_or_zero(text: str) -> float:
    """An argparse type: a duration in seconds, >= 0 (0: off) and at most MAX_WAIT_S."""
    return _at_most(non_negative_float(text), MAX_WAIT_S, text)


def milliseconds_or_zero(text: str) -> float:
    """An argparse type: a duration in milliseconds, >= 0 and at most MAX_WAIT_S in milliseconds."""
    return _at_most(non_negative_float(text), MAX_WAIT_S * 1000, text)


def _at_most(value: float, limit: float, text: str) -> float:
    if value > limit:
        raise argparse.ArgumentTypeError(f"must be at most {limit:g}, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a finite float >= 0."""
    value = _finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def burst(text: str) -> float:
    """An argparse type: a token bucket's burst, a finite float >= 1 (a call takes at least one: less admits none)."""
    value = _finite_float(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (each call takes at least one), got {text}")
    return value


def probability(text: str) -> float:
    """An argparse type: a float in [0, 1]."""
    value = _finite_float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def probability_or_auto(text: str) -> float | None:
    """An argparse type: `auto` (None: decided at run time, e.g. by the coordinator's cost model) or a float in
    [0, 1]."""
    return None if text == "auto" else probability(text)


# model dtypes a service accepts (calispec_core.modeling checks the same list; kept here, free of
# torch and of the serving extras, so light command-line parsers can offer it)
INT8 = "int8"  # dynamic quantisation of every Linear layer (CPU only)
DTYPE_CHOICES = ["auto", "float32", "bfloat16", "float16", INT8]
LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]  # every service's --log-level
# how float32 Linear layers multiply on CPU (calispec_core/onednn_linear.py): "onednn" runs them on
# oneDNN, whose cost stays flat in rows where MKL's SGEMM grows ~linearly on some CPUs; "packed" also
# keeps each weight prepacked for multi-row products (cheaper verify forwards, twice the float32
# weights' memory); "auto" packs where the host's (or the pod's) free memory holds the copy twice over,
# else onednn; "default" keeps torch's own path. bf16 layers follow it on CPUs with bf16 units (wave 28);
# other dtypes ignore it.
FP32_LINEAR_CHOICES = ("auto", "packed", "onednn", "default")
# int8 models, a forward holding a sequence's first token (calispec_core/int8_outliers.py): "split" quantises its
# outlier rows apart from the others, "shared" keeps torch's one activation scale over every row of a call
INT8_SPLIT, INT8_SHARED = "split", "shared"
INT8_OUTLIER_CHOICES = (INT8_SPLIT, INT8_SHARED)
# teacher-forced calibration's int8 draft: one activation scale a call (outlier rows apart; the shipped file's count)
# or every row its own, as the draft's one-token serving steps quantise (calispec_core/int8_gemm.py, row scales)
INT8_SCALE_CALL, INT8_SCALE_ROW = "call", "row"
INT8_SCALE_CHOICES = (INT8_SCALE_CALL, INT8_SCALE_ROW)
# how the coordinator's lockstep rounds choose their members' γ (coordinator/round_plan.py): "group" plans the round
# for the whole group by the cost model (the default since wave 38), "median" is wave 6's cap at the drafting
# members' lower median wish, "shared" gives every adaptive member that cap's length
LockstepPhase = Literal["group", "median", "shared"]
LOCKSTEP_PHASES: tuple[LockstepPhase, ...] = ("group", "median", "shared")
DEFAULT_LOCKSTEP_PHASE: LockstepPhase = "group"


# how the coordinator's HTTP chat reads tool calls in a reply (coordinator/tool_calls.py; vLLM's --tool-call-parser
# names): "hermes", the `<tool_call>` JSON blocks of Qwen2.5 and other Hermes-format models
TOOL_CALL_PARSERS = ("hermes",)


def require_lockstep_phase(rule: str) -> None:
    """The coordinator's config and the orchestrator's both refuse an unknown rule (the orchestrator's would fail
    every round start with a KeyError)."""
    require(rule in LOCKSTEP_PHASES, f"lockstep_phase must be one of {', '.join(LOCKSTEP_PHASES)}, got {rule!r}")

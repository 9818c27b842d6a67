"""Hard limits every service enforces the same way (requests beyond them are INVALID_ARGUMENT)."""

from __future__ import annotations

import argparse

from calispec_core.errors import require

MAX_SPECULATIVE_TOKENS = 16  # gamma; the paper uses 6
MAX_NEW_TOKENS = 8192
MAX_PROMPT_CHARS = 1_000_000
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_LAMBDA = 2**31 - 1  # the coordinator API's int32 field


def check_csd_thresholds(tau: float | None = None, lambda_: int | None = None) -> None:
    """CSD's τ in (0, 1] and λ in [0, MAX_LAMBDA]: for requests, server defaults and flags alike."""
    require(tau is None or 0.0 < tau <= 1.0, f"tau must be in (0, 1], got {tau}")
    require(lambda_ is None or lambda_ >= 0, f"lambda must be >= 0, got {lambda_}")
    require(lambda_ is None or lambda_ <= MAX_LAMBDA, f"lambda must be <= {MAX_LAMBDA}, got {lambda_}")


def _int_at_least(text: str, minimum: int) -> int:
    value = int(text)
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: an int >= 0."""
    return _int_at_least(text, 0)


# model dtypes a service accepts (calispec_core.modeling checks the same list; kept here, free of
# torch and of the serving extras, so light command-line parsers can offer it)
DTYPE_CHOICES = ["auto", "float32", "bfloat16", "float16", "int8"]
LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]  # every service's --log-level
# how float32 Linear layers multiply on CPU (calispec_core/onednn_linear.py): "onednn" runs them on
# oneDNN, whose cost stays flat in rows where MKL's SGEMM grows ~linearly on some CPUs; "packed" also
# keeps each weight prepacked for multi-row products (cheaper verify forwards, twice the float32
# weights' memory); "auto" packs where the host's (or the pod's) free memory holds the copy twice over,
# else onednn; "default" keeps torch's own path. Other dtypes ignore it.
FP32_LINEAR_CHOICES = ("auto", "packed", "onednn", "default")

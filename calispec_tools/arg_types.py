"""argparse types of the tools' numeric flags (bench, eval, calibrate, up): a value out of range is an
argparse error (one line, exit 2) before anything runs, never a traceback half-way (`bench --rate -1`)
nor a run that measures nothing (`--concurrency 0`, `--num-requests -5`).

The services' types (calispec_core/limits.py, γ and max_new_tokens included: the coordinator's
defaults take them too) plus what only the tools need: τ and λ as flags, open-loop rates and
comma-separated sweeps. Light on purpose (no torch, no grpc): `calispec --help` builds every parser.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from calispec_core.errors import InvalidArgument
from calispec_core.limits import (
    check_csd_thresholds,
    gamma,
    max_new_tokens,
    non_negative_float,
    non_negative_int,
    port,
    positive_float,
    positive_int,
)

T = TypeVar("T")

__all__ = [
    "csv_of", "gamma", "lambda_", "max_new_tokens", "non_negative_float", "non_negative_int", "port",
    "positive_float", "positive_int", "rate", "tau", "window_tokens",
]  # fmt: skip

# a calibration window predicts each of its tokens from those before it: one token compares nothing
# (calispec_tools/calibrate/job.py's CalibrateConfig refuses less)
MIN_WINDOW_TOKENS = 2


def rate(text: str) -> float:
    """Requests per second: > 0, where inf sends every request at once (bench/arrivals.py)."""
    value = float(text)
    if not value > 0:  # nan too
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _checked(value: T, check: Callable[[T], None]) -> T:
    """A value kept in the range requests must keep (calispec_core.limits)."""
    try:
        check(value)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def window_tokens(text: str) -> int:
    """Calibration's --max-tokens (the window length): an int >= MIN_WINDOW_TOKENS."""
    value = int(text)
    if value < MIN_WINDOW_TOKENS:
        raise argparse.ArgumentTypeError(f"must be >= {MIN_WINDOW_TOKENS} (a window of one token compares nothing), "
                                         f"got {value}")  # fmt: skip
    return value


def tau(text: str) -> float:
    """CSD's τ, in (0, 1]."""
    return _checked(float(text), lambda t: check_csd_thresholds(tau=t))


def lambda_(text: str) -> int:
    """CSD's λ, in [0, MAX_LAMBDA]."""
    return _checked(int(text), lambda lam: check_csd_thresholds(lambda_=lam))


def csv_of(kind: Callable[[str], T], what: str) -> Callable[[str], list[T]]:
    """A comma-separated list of `kind` (a sweep); `what` names the items in the error."""

    def parse(text: str) -> list[T]:
        values = []
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            try:
                values.append(kind(part))
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") from None
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentTypeError(f"{part}: {exc}") from None
        return values

    return parse

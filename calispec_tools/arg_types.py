"""argparse types of the tools' flags (bench, eval, calibrate, up, and the request flags of generate, chat and
demo): a value out of range is an argparse error (one line, exit 2) before anything runs, never a traceback
half-way (`bench --rate -1`), a run that measures nothing (`--concurrency 0`, `--num-requests -5`) nor a
request the server refuses (`generate --top-p 2`, after the connection; `demo`'s, after the model loads).

The services' types (calispec_core/limits.py, γ, τ and max_new_tokens included: the coordinator's
defaults take them too) plus what only the tools need: λ as a flag, a request's fields, open-loop
rates and comma-separated sweeps. A request's field takes what the coordinator takes, by the same checks
(calispec_core/limits.py), on the value as the API carries it (float32 fields are rounded first).
Light on purpose (no torch, no grpc): `calispec --help` builds every parser.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from calispec_core.errors import InvalidArgument
from calispec_core.limits import (
    MAX_NEW_TOKENS,
    as_float32,
    check_csd_thresholds,
    check_logit_rules,
    check_sampling,
    check_stop_strings,
    flag_checked,
    flag_error,
    gamma,
    grpc_address,
    int_at_least,
    int_in_range,
    lambda_,
    logprobs,
    max_new_tokens,
    milliseconds_or_zero,
    namespace,
    non_negative_float,
    non_negative_int,
    port,
    positive_float,
    positive_int,
    require_unicode,
    seconds_or_zero,
    tau,
    threads,
    validate_prompt,
)

T = TypeVar("T")

__all__ = [
    "StopStrings", "address", "chat_text", "csv_of", "gamma", "lambda_", "logprobs", "max_new_tokens",
    "max_new_tokens_or_default", "milliseconds_or_zero", "non_negative_float", "non_negative_int", "port",
    "positive_float", "positive_int", "prompt", "rate", "request_tau", "seconds_or_zero", "seed", "stop_string",
    "tau", "temperature", "threads", "top_k", "top_p", "window_tokens",
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


_window_tokens = int_at_least(MIN_WINDOW_TOKENS, "(a window of one token compares nothing)")


def window_tokens(text: str) -> int:
    """Calibration's --max-tokens (the window length): an int >= MIN_WINDOW_TOKENS."""
    return _window_tokens(text)


# -- a request's fields (generate, chat, demo; bench and eval where they send one as given) ----------------

# max_new_tokens as a request carries it: 0 leaves it to the server's default
max_new_tokens_or_default = int_in_range(0, MAX_NEW_TOKENS)


def _float32_field(text: str, check: Callable[[float], None]) -> float:
    """A request's float32 field, checked as the coordinator sees it; returned as given (the SDK rounds it)."""
    value = float(text)
    sent = as_float32(value)
    try:
        check(sent)
    except InvalidArgument as exc:
        rounded = "" if sent == value or math.isnan(value) else f" ({text} as the API's float32)"
        raise argparse.ArgumentTypeError(f"{flag_error(exc)}{rounded}") from None
    return value


def temperature(text: str) -> float:
    """A request's temperature, in [0, MAX_TEMPERATURE] (below 1e-5: greedy)."""
    return _float32_field(text, lambda t: check_sampling(temperature=t))


def top_p(text: str) -> float:
    """A request's top-p, in [0, 1] (0 or 1: off)."""
    return _float32_field(text, lambda p: check_sampling(top_p=p))


def presence_penalty(text: str) -> float:
    """A request's presence penalty, in [-2, 2]."""
    return _float32_field(text, lambda v: check_logit_rules(presence_penalty=v))


def frequency_penalty(text: str) -> float:
    """A request's frequency penalty, in [-2, 2]."""
    return _float32_field(text, lambda v: check_logit_rules(frequency_penalty=v))


def repetition_penalty(text: str) -> float:
    """A request's repetition penalty, in [0.01, 2] (1: off)."""
    return _float32_field(text, lambda v: check_logit_rules(repetition_penalty=v))


def min_p(text: str) -> float:
    """A request's min_p, in [0, 1] (0: off)."""
    return _float32_field(text, lambda v: check_logit_rules(min_p=v))


def min_tokens(text: str) -> int:
    """A request's min_tokens, in [0, MAX_NEW_TOKENS]."""
    return flag_checked(int(text), lambda n: check_logit_rules(min_tokens=n))


def request_tau(text: str) -> float:
    """A request's CSD τ, in (0, 1] as its float32 field carries it (`tau` is a server's own, a default)."""
    return _float32_field(text, lambda t: check_csd_thresholds(tau=t))


def top_k(text: str) -> int:
    """A request's top-k, in [0, MAX_TOP_K] (0: off; a model service also bounds it by its vocabulary)."""
    return flag_checked(int(text), lambda k: check_sampling(top_k=k))


def seed(text: str) -> int:
    """A request's seed, in [0, 2**63)."""
    return flag_checked(int(text), lambda s: check_sampling(seed=s))


address = grpc_address  # the services' check (calispec_core/limits.py)


def http_url(text: str) -> str:
    """An http(s) base URL with a host (`--openai-url notaurl` failed after the start, its message garbled)."""
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in ("http", "https") or not rest.split("/", 1)[0]:
        raise argparse.ArgumentTypeError(f"must be an http:// or https:// URL with a host, got {text!r}")
    return text.rstrip("/")


def path_text(text: str) -> str:
    """A path flag whose absence means a default: not empty (`--tls-dir ''`, i.e. an unset shell variable, ran
    plaintext without a word; `--memory-db ''` and `--log-dir ''` fell back to the defaults; found by probing)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty (leave the flag out for its default)")
    return text


def memory_namespace(text: str) -> str:
    """A correction-memory namespace: not empty (`--namespace ''` fell back to the default without a word; leave
    the flag out for that), and of the characters the memory service takes (as the target's flag: limits.namespace)."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty (leave the flag out for the default)")
    return namespace(text)


def prompt(text: str) -> str:
    """A raw prompt the coordinator takes: not empty, not too long, valid Unicode."""
    return flag_checked(text, validate_prompt)


def chat_text(text: str) -> str:
    """A chat message: valid Unicode (command-line bytes that are no UTF-8 decode to lone surrogates, which
    protobuf cannot encode: a traceback from the SDK)."""
    return flag_checked(text, lambda t: require_unicode(t, "the message"))


def _check_stop_string(text: str) -> None:
    check_stop_strings([text])
    require_unicode(text, "the stop string")


def stop_string(text: str) -> str:
    """One stop string: 1 to MAX_STOP_STRING_CHARS characters of valid Unicode."""
    return flag_checked(text, _check_stop_string)


class StopStrings(argparse.Action):
    """--stop, repeatable (type=stop_string): at most MAX_STOP_STRINGS of them, as a request carries."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        stops: Sequence[str] = [*(getattr(namespace, self.dest) or []), values]  # a copy: the default is shared
        try:
            check_stop_strings(stops)
        except InvalidArgument as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        setattr(namespace, self.dest, stops)


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


def csv_choices(choices: Sequence[str], what: str) -> Callable[[str], list[str]]:
    """A non-empty comma-separated list of `choices` (modes, task kinds): `--tasks ,` ran nothing and exited 1, a
    kind outside them was read as a path (`--tasks ../prompts/code`: a KeyError traceback)."""

    def parse(text: str) -> list[str]:
        values = [p.strip() for p in text.split(",") if p.strip()]
        if not values or any(v not in choices for v in values):
            raise argparse.ArgumentTypeError(f"{what} must be among {', '.join(choices)}; got {text!r}")
        return values

    return parse


class OwnFlagsSubcommands(argparse._SubParsersAction):
    """Subcommands that take none of their parent's flags. argparse lets a subcommand's default overwrite the
    value a user gave the same flag before the subcommand's name (`bench --no-meaning-guard compare` ran with
    the guard) and silently drops the parent's other flags (`bench --modes sd compare`), so a parent flag given
    before a subcommand is refused, naming where it belongs. `add_subparsers(action=OwnFlagsSubcommands)`."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        name = values[0]
        child = self._name_parser_map.get(name)
        own = {a.dest for a in child._actions} if child else set()
        # help runs nothing, so nothing is ignored (argparse takes `--he` for `--help`)
        asks_help = any(value == "-h" or (len(value) > 3 and "--help".startswith(value)) for value in values[1:])
        for action in () if asks_help else parser._actions:
            # argparse builds a new object for every value it parses, so identity tells a given flag from its
            # default (a small int equal to its default passes: the same value either way)
            given = getattr(namespace, action.dest, action.default) is not action.default
            if action.option_strings and action.default is not argparse.SUPPRESS and given:
                flag = action.option_strings[0]
                where = f"give it after `{name}`" if action.dest in own else f"`{name}` does not take it"
                parser.error(f"{flag} before `{name}` would be ignored: {where}")
        super().__call__(parser, namespace, values, option)

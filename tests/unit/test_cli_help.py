"""What `--help` shows: metavars read as the flags they belong to."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from calispec_tools import cli


def subcommands(
    parser: argparse.ArgumentParser, name: str = "calispec"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every (sub)command's parser, by its full name (`calispec bench compare`)."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from subcommands(sub, f"{name} {sub_name}")


def help_of(command: str) -> str:
    return dict(subcommands(cli.build_parser()))[f"calispec {command}"].format_help()


@pytest.mark.parametrize("command", ["generate", "chat", "demo", "bench"])
def test_lambda_shows_as_lambda(command: str) -> None:
    """It showed as `--lambda LAMBDA_` (argparse's metavar from dest="lambda_")."""
    text = help_of(command)
    assert "--lambda LAMBDA" in text
    assert "LAMBDA_" not in text


def test_no_metavar_shows_a_trailing_underscore() -> None:
    """A dest that dodges a keyword (`lambda_`) needs its own metavar, in every command."""
    shown = {
        name: found
        for name, parser in subcommands(cli.build_parser())
        if (found := re.findall(r"\b[A-Z][A-Z0-9_]*_\b", parser.format_help()))
    }
    assert shown == {}


def test_up_help_names_the_lambdas_chosen_for_the_shipped_calibration() -> None:
    """`up --help` said qwen-coder's float32 λ was 3 for twenty waves after it became 6."""
    from calispec_tools.shipped_calibration import CHOSEN_LAMBDA

    text = " ".join(help_of("up").split())
    for dtype, lam in CHOSEN_LAMBDA["qwen-coder"].items():
        assert f"{lam} on {dtype}" in text

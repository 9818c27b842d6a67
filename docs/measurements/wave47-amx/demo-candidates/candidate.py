"""Run `calispec demo` with another built-in demo message (scratch, wave 47)."""

import dataclasses
import sys

from calispec_tools import cli
from calispec_tools.models import registry

registry.PAIRS["qwen-coder"] = dataclasses.replace(registry.PAIRS["qwen-coder"], demo_message=sys.argv[1])
sys.exit(cli.main(["demo", *sys.argv[2:]]))

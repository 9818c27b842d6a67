"""`calispec up` watches its services: one that exits is named once; the coordinator's exit stops the stack (wave 50,
found by probing: it said nothing, and the dead service stayed a zombie until `calispec down`)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from calispec_tools.cli import watch_services


class Exits:
    """A process that runs for `polls` polls, then has exited with `status`."""

    def __init__(self, polls: int | None, status: int = 137) -> None:
        self.left, self.status = polls, status

    def poll(self) -> int | None:
        if self.left is None:
            return None
        self.left -= 1
        return self.status if self.left < 0 else None


def service(process: Exits, name: str) -> SimpleNamespace:
    return SimpleNamespace(process=process, log_path=Path(f"/logs/{name}.log"))


@pytest.mark.parametrize("needed", ["coordinator", "target_service"])
def test_a_lost_draft_is_named_once_and_a_needed_services_exit_stops_the_stack(
    needed: str, capsys: pytest.CaptureFixture
) -> None:
    services = {
        "coordinator": service(Exits(None), "coordinator"),
        "draft_service": service(Exits(0, status=-9), "draft_service"),
        "target_service": service(Exits(None), "target_service"),
    }
    services[needed] = service(Exits(2, status=1), needed)
    assert watch_services(threading.Event(), services) == needed
    assert capsys.readouterr().err.splitlines() == [
        "error: draft_service was killed by SIGKILL (its log: /logs/draft_service.log); the stack serves on without it",
        f"error: {needed} exited with status 1 (its log: /logs/{needed}.log); stopping the stack",
    ]


def test_a_stop_with_every_service_running_says_nothing(capsys: pytest.CaptureFixture) -> None:
    stop = threading.Event()
    stop.set()
    assert watch_services(stop, {"coordinator": service(Exits(None), "coordinator")}) is None
    assert capsys.readouterr().err == ""

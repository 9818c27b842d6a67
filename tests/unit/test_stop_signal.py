"""A service's main thread stops on a SIGTERM that the kernel hands to another of its threads; so does
`calispec up` while it waits for a service's readiness line."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# The main thread blocks SIGTERM, so the kernel must deliver it to the other thread; Python then runs the
# handler only when the main thread executes bytecode again (a bare Event.wait() never did: a CI hang).
CHILD = """
import signal, threading
from calispec_core.interrupts import wait_for_stop
from calispec_core.service_cli import stop_on_signals

stop = stop_on_signals()
threading.Thread(target=threading.Event().wait, daemon=True).start()  # inherits the unblocked mask
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
print("waiting", flush=True)
wait_for_stop(stop)
print("stopped", flush=True)
"""


def _sigterm_once_waiting(child: str, never_handled: str) -> tuple[int, str, str]:
    """Run `child`, send SIGTERM once it prints "waiting"; (exit code, the rest of stdout, stderr). A child
    still running 60 s later (a hang detector, not a timing check: a fix exits at once) fails the test."""
    proc = subprocess.Popen(
        [sys.executable, "-c", child], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "waiting\n"
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(never_handled) from None
    return proc.returncode, out, err


def test_sigterm_taken_by_another_thread_still_stops_the_main_thread() -> None:
    code, out, err = _sigterm_once_waiting(CHILD, "SIGTERM delivered to a non-main thread was never handled")
    assert (code, out) == (0, "stopped\n"), err


# `calispec up`'s start-up: the main thread waits for a service's readiness line (minutes, on a slow model
# load) while the SIGTERM lands on another thread; its handler raises, as `stack_command`'s does.
STARTUP_CHILD = """
import signal, threading
from pathlib import Path
from calispec_tools.stack import ServiceProcess

class Terminated(Exception):
    pass

def terminate(*_):
    raise Terminated

signal.signal(signal.SIGTERM, terminate)
service = ServiceProcess("target_service", None, Path("target.log"), [])
threading.Thread(target=threading.Event().wait, daemon=True).start()  # inherits the unblocked mask
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
try:
    print("waiting", flush=True)
    service.wait_ready(timeout_s=3600)
except Terminated:
    print("interrupted", flush=True)
"""


def test_sigterm_taken_by_another_thread_interrupts_up_waiting_for_a_service() -> None:
    # without the fix the child waits the hour out
    never_handled = "SIGTERM during the wait for a readiness line was never handled"
    code, out, err = _sigterm_once_waiting(STARTUP_CHILD, never_handled)
    assert (code, out) == (0, "interrupted\n"), err


ANNOUNCER = """
import sys
from calispec_core.service_cli import announce

sys.stdin.readline()  # until the launcher has gone away (its end of our stdout closed)
announce("draft metrics on http://127.0.0.1:1/metrics")
announce("draft listening on 127.0.0.1:2")
print("served on", file=sys.stderr)
"""


def test_a_service_whose_launcher_went_away_does_not_die_at_its_readiness_line() -> None:
    """`calispec up` killed while the draft loaded its model: the draft's metrics line raised BrokenPipeError, a
    traceback and exit 1 (found by probing). The lines go nowhere; the service goes on (and stops at its stdin's
    end when asked to)."""
    child = subprocess.Popen([sys.executable, "-c", ANNOUNCER], cwd=REPO_ROOT, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None
    child.stdout.close()
    child.stdin.write("go\n")
    child.stdin.close()
    stderr = child.stderr.read()
    assert child.wait(timeout=60) == 0, stderr
    assert "Traceback" not in stderr and stderr.rstrip().endswith("served on")
    assert "stdout is closed" in stderr


HANGUP_CHILD = """
import os, signal
from calispec_core.service_cli import stop_on_signals

stop = stop_on_signals()
os.kill(os.getpid(), signal.SIGHUP)  # a fleet-wide "HUP to reload"
print("alive", stop.is_set(), flush=True)
"""


def test_sighup_neither_ends_a_service_nor_stops_it_and_keeps_a_reload_handler() -> None:
    """SIGHUP's default action ended the draft, target and memory services (they have nothing to reload)."""
    done = subprocess.run([sys.executable, "-c", HANGUP_CHILD], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "alive False\n"), done.stderr
    from calispec_core.service_cli import stop_on_signals

    def reload_keys(*_: object) -> None:  # the coordinator's handler, installed before stop_on_signals runs
        pass

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    signal.signal(signal.SIGHUP, reload_keys)
    try:
        stop_on_signals()
        assert signal.getsignal(signal.SIGHUP) is reload_keys  # kept
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)

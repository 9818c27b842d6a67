"""The Ray scenarios' failure message carries the tails of the node's own logs (tests/e2e/netns.py)."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.netns import ray_log_tails


def test_a_failed_scenario_shows_the_raylet_and_gcs_logs(tmp_path: Path) -> None:
    session = tmp_path / "ray" / "session_2026-12-03_18-04-30"
    (session / "logs").mkdir(parents=True)
    (tmp_path / "ray" / "session_latest").symlink_to(session)
    (session / "logs" / "raylet.err").write_text("".join(f"line {i}\n" for i in range(40)))
    (session / "logs" / "gcs_server.out").write_text("GCS started\n")
    (session / "logs" / "worker-1.out").write_text("not this one\n")
    tails = ray_log_tails(tmp_path)
    assert "--- ray/session_latest/logs/raylet.err" in tails and "line 39" in tails and "line 24" not in tails
    assert "GCS started" in tails and "not this one" not in tails
    assert "logs holds: gcs_server.out, raylet.err, worker-1.out" in tails  # a raylet with no log shows as missing
    assert ray_log_tails(tmp_path / "nothing-here") == ""

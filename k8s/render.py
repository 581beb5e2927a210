"""Render a kustomize overlay without the kustomize binary.

    python k8s/render.py k8s/overlays/prod > rendered.yaml

Supports exactly the kustomize subset the manifests under ``k8s/`` use, and refuses anything else
so a new feature cannot be silently ignored:

- ``resources``: local files and directories holding a ``kustomization.yaml`` (no URLs);
- ``namespace``: set on every (namespaced) resource;
- ``images``: ``name`` plus ``newName``/``newTag``;
- ``patches``: ``path`` to one strategic-merge patch of a Deployment, matched by kind and name.
  Lists merge on the keys Kubernetes declares for them (containers and env by ``name`` ...),
  the patch's items first; a ``null`` value deletes a key; ``$patch`` directives are refused.

Transformations run in kustomize's order (patches, namespace, images) and the output is sorted
in kustomize's default ("legacy") order with sorted keys, so ``kubectl kustomize DIR`` produces
the same documents (tests/unit/k8s checks this whenever kubectl is on the PATH).
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

Doc = dict[str, Any]

KUSTOMIZATION_KEYS = frozenset(
    {"apiVersion", "kind", "resources", "namespace", "images", "patches"}
)
IMAGE_KEYS = frozenset({"name", "newName", "newTag"})
# Kinds that have no namespace; kustomize leaves them alone too.
CLUSTER_SCOPED = frozenset(
    {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "StorageClass",
        "PersistentVolume",
        "PriorityClass",
    }
)
# patchMergeKey of the pod-spec lists a Deployment patch can touch (from the Kubernetes API).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
}
# kustomize's legacy output order: these kinds first, in this order; webhooks last; the rest
# in between by group/version/kind; ties by namespace and name.
ORDER_FIRST = (
    "Namespace",
    "ResourceQuota",
    "StorageClass",
    "CustomResourceDefinition",
    "ServiceAccount",
    "PodSecurityPolicy",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "ConfigMap",
    "Secret",
    "Endpoints",
    "Service",
    "LimitRange",
    "PriorityClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "Deployment",
    "StatefulSet",
    "CronJob",
    "PodDisruptionBudget",
)
ORDER_LAST = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


class RenderError(ValueError):
    """The kustomization uses something this renderer does not support, or is inconsistent."""


def _load_docs(path: Path) -> list[Doc]:
    with path.open(encoding="utf-8") as fh:
        docs = [doc for doc in yaml.safe_load_all(fh) if doc is not None]
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc or "metadata" not in doc:
            raise RenderError(f"{path}: every document needs kind and metadata")
    return docs


def _resource_id(doc: Doc) -> tuple[str, str, str, str]:
    meta = doc["metadata"]
    return (doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"])


def build(directory: Path) -> list[Doc]:
    """The resources of the kustomization in `directory`, transformed, in input order."""
    kfile = directory / "kustomization.yaml"
    if not kfile.is_file():
        raise RenderError(f"{directory}: no kustomization.yaml")
    kust = yaml.safe_load(kfile.read_text(encoding="utf-8")) or {}
    unknown = set(kust) - KUSTOMIZATION_KEYS
    if unknown:
        raise RenderError(f"{kfile}: unsupported fields {sorted(unknown)}")

    docs: list[Doc] = []
    for entry in kust.get("resources", []):
        if "://" in entry or entry.startswith("github.com/"):
            raise RenderError(f"{kfile}: remote resource {entry!r} is not supported")
        path = (directory / entry).resolve()
        docs.extend(build(path) if path.is_dir() else _load_docs(path))
    seen: set[tuple[str, str, str, str]] = set()
    for doc in docs:
        rid = _resource_id(doc)
        if rid in seen:
            raise RenderError(f"{kfile}: duplicate resource {rid}")
        seen.add(rid)

    for patch in kust.get("patches", []):
        if set(patch) != {"path"}:
            raise RenderError(f"{kfile}: only `patches: [{{path: ...}}]` is supported")
        for patch_doc in _load_docs(directory / patch["path"]):
            _apply_patch(docs, patch_doc, where=f"{directory / patch['path']}")
    if "namespace" in kust:
        for doc in docs:
            if doc["kind"] not in CLUSTER_SCOPED:
                doc["metadata"]["namespace"] = kust["namespace"]
    for image in kust.get("images", []):
        if not set(image) <= IMAGE_KEYS or "name" not in image:
            raise RenderError(f"{kfile}: images support only {sorted(IMAGE_KEYS)}")
        for doc in docs:
            _set_image(doc, image)
    return docs


def _apply_patch(docs: list[Doc], patch: Doc, *, where: str) -> None:
    if patch["kind"] != "Deployment":
        raise RenderError(f"{where}: only Deployments are patched (merge keys are pod-spec ones)")
    name = patch["metadata"]["name"]
    targets = [
        d
        for d in docs
        if d["kind"] == patch["kind"]
        and d["apiVersion"] == patch["apiVersion"]
        and d["metadata"]["name"] == name
    ]
    if len(targets) != 1:
        raise RenderError(f"{where}: expected one {patch['kind']} {name!r}, found {len(targets)}")
    _merge_map(targets[0], patch, where)


def _merge_map(base: dict[str, Any], patch: dict[str, Any], where: str) -> None:
    for key, value in patch.items():
        if key.startswith("$"):
            raise RenderError(f"{where}: patch directive {key!r} is not supported")
        current = base.get(key)
        if value is None:
            base.pop(key, None)
        elif isinstance(value, dict) and isinstance(current, dict):
            _merge_map(current, value, where)
        elif isinstance(value, list) and key in MERGE_KEYS and isinstance(current, list):
            _merge_list(current, value, MERGE_KEYS[key], where)
        else:
            base[key] = copy.deepcopy(value)


def _merge_list(base: list[Any], patch: list[Any], merge_key: str, where: str) -> None:
    """Merge items sharing `merge_key`, in kustomize's order: the patch's items first, in patch
    order, then the items only the base has, in base order."""
    merged: list[Any] = []
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise RenderError(f"{where}: list items need their merge key {merge_key!r}")
        match = next((b for b in base if b.get(merge_key) == item[merge_key]), None)
        if match is None:
            merged.append(copy.deepcopy(item))
        else:
            _merge_map(match, item, where)
            merged.append(match)
    patched = {item[merge_key] for item in patch}
    merged.extend(b for b in base if b.get(merge_key) not in patched)
    base[:] = merged


def _split_image(image: str) -> tuple[str, str, str]:
    """``name[:tag][@digest]`` -> (name, ":tag" or "", "@digest" or "")."""
    name, _, digest = image.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = ""
    if colon > slash:  # a colon before the last slash is a registry port, not a tag
        name, tag = name[:colon], name[colon:]
    return name, tag, f"@{digest}" if digest else ""


def _set_image(doc: Doc, image: dict[str, str]) -> None:
    pod_spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    for field in ("initContainers", "containers"):
        for container in pod_spec.get(field, []):
            name, tag, digest = _split_image(container.get("image", ""))
            if name != image["name"]:
                continue
            if "newTag" in image:
                tag, digest = f":{image['newTag']}", ""
            container["image"] = f"{image.get('newName', name)}{tag}{digest}"


def _sort_key(doc: Doc) -> tuple[int, str, str, str]:
    kind = doc["kind"]
    if kind in ORDER_FIRST:
        rank = ORDER_FIRST.index(kind) - len(ORDER_FIRST)
    elif kind in ORDER_LAST:
        rank = ORDER_LAST.index(kind) + 1
    else:
        rank = 0
    group_version, _, version = doc["apiVersion"].rpartition("/")
    gvk = f"{group_version}_{version}_{kind}" if group_version else f"{version}_{kind}"
    meta = doc["metadata"]
    return (rank, gvk, meta.get("namespace", ""), meta["name"])


def render(directory: Path) -> list[Doc]:
    """The documents `kustomize build directory` would print, in the same order."""
    return sorted(build(directory), key=_sort_key)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the sidecar config files) print as readable ``|`` blocks."""


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_representer)


def dump(docs: Sequence[Doc]) -> str:
    """Multi-document YAML, keys sorted as kustomize prints them."""
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=True, default_flow_style=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overlay", type=Path, help="directory holding a kustomization.yaml")
    args = parser.parse_args(argv)
    try:
        sys.stdout.write(dump(render(args.overlay)))
    except (RenderError, OSError, yaml.YAMLError) as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

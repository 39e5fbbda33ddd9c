"""Turn the pod template TorchX renders into the hardened pod this repository runs.

:func:`pod_options` parses and checks the run options into :class:`PodOptions`;
:func:`customize_pod` takes one task's pod template as plain data (what the Kubernetes client's
``sanitize_for_serialization`` gives), those options and the processes the pod runs, and
returns the new template: hardened security context, writable volumes where training writes
under a read-only root file system, a sized /dev/shm, the checkpoint claim, secrets, scheduling
constraints, image pull secrets and the termination grace period
(:mod:`components.schedulers.k8s.preemption`). It raises
:class:`components.errors.ComponentArgumentError` (one line, named after the scheduler) for a
template the options cannot serve.

/dev/shm: without ``shm_size`` it is sized from the processes the pod runs
(:func:`processes_per_pod`) as :data:`SHM_FLOOR` plus :data:`SHM_PER_PROCESS` a process, at most
the pod's memory limit (a memory emptyDir counts against it). Each rank's users of shared
memory: its DataLoader workers hand every batch over through /dev/shm
(``num_workers * prefetch_factor`` batches in flight a rank; a token batch is well under a
MiB, an image batch tens of MiB); NCCL between GPUs of one pod without peer-to-peer access
(its SHM transport) keeps 4 MiB (``NCCL_BUFFSIZE``) plus its LL and LL128 buffers per channel
and peer there, tens to a few hundred MiB a rank. 512 MiB a process covers both with room; the
1 GiB floor serves what runs besides the ranks (torchrun, ``torch.multiprocessing``'s shared
tensors). An explicit ``shm_size`` wins, and must fit the memory limit.
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torchx.specs import AppDef, Role

from components.schedulers.k8s.options import (
    NodeShape,
    SecretEnv,
    check_subdomain,
    parse_node_selector,
    parse_node_shapes,
    parse_pvc,
    parse_quantity,
    parse_secret_env,
    parse_secret_volumes,
    parse_tolerations,
    refuse,
)
from components.schedulers.k8s.preemption import (
    DEFAULT_TERMINATION_GRACE_S,
    check_termination_grace,
)

# The image's layout (images/): the repository at WORKDIR, a numeric non-root user, its HOME.
WORKDIR = "/opt/torchx-templates"
OUTPUTS_DIR = f"{WORKDIR}/outputs"
HOME_DIR = "/home/trainer"
USER_ID = 1000
# /dev/shm without shm_size: the floor plus a share a process (module docstring).
SHM_FLOOR = 2**30
SHM_PER_PROCESS = 2**29

Pod = dict[str, Any]


@dataclass(frozen=True)
class PodOptions:
    """What the run options of scheduler ``scheduler`` (its registered name, which starts its
    errors) ask of every pod, already parsed and checked; ``shm_size`` None sizes /dev/shm by
    the processes of the pod (module docstring)."""

    scheduler: str
    shm_size: str | None = None
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


def processes_per_pod(role: Role) -> int:
    """The processes each pod of ``role`` runs: torchrun's ``--nproc_per_node`` (or
    ``--nproc-per-node``) among the role's arguments, as words of their own or inside a
    ``bash -c`` script; where it is missing or not a number, one a GPU of the role's resource
    (torchrun's ``gpu``), at least 1."""
    words = [word for arg in role.args for word in _words(arg)]
    for i, word in enumerate(words):
        key, eq, value = word.partition("=")
        if key in ("--nproc_per_node", "--nproc-per-node"):
            value = value if eq else " ".join(words[i + 1:i + 2])
            if value.isdigit() and int(value) > 0:
                return int(value)
    return max(role.resource.gpu, 1)


def _words(arg: str) -> list[str]:
    """The shell words of one argument (a ``bash -c`` script has many)."""
    try:
        return shlex.split(arg)
    except ValueError:  # an unbalanced quote: the words as written
        return arg.split()


def shm_quantity(nbytes: int) -> str:
    """``nbytes`` as a Kubernetes quantity: whole GiB as ``NGi``, else ``NMi`` (rounded up)."""
    if nbytes % 2**30 == 0:
        return f"{nbytes // 2**30}Gi"
    return f"{-(-nbytes // 2**20)}Mi"


SHM_RULE = (f"{shm_quantity(SHM_FLOOR)} plus {shm_quantity(SHM_PER_PROCESS)} per process of the "
            "pod (torchrun's --nproc_per_node)")


def pod_options(scheduler: str, cfg: Mapping[str, Any], app: AppDef) -> PodOptions:
    """The run options of ``cfg`` parsed and checked into :class:`PodOptions` for the pods of
    ``app``; raises ComponentArgumentError (one line, starting ``scheduler:``) for a bad one,
    or for a role whose pods fit none of ``node_shapes``."""
    grace = cfg.get("termination_grace_s")
    grace = DEFAULT_TERMINATION_GRACE_S if grace is None else grace
    for role in app.roles:
        check_termination_grace(scheduler, grace, role.env.get("PET_SHUTDOWN_TIMEOUT"))
    claim, path = (parse_pvc(scheduler, cfg["checkpoint_pvc"], OUTPUTS_DIR)
                   if cfg.get("checkpoint_pvc") else (None, OUTPUTS_DIR))
    shm_size = cfg.get("shm_size") or None
    if shm_size is not None:
        parse_quantity(scheduler, "shm_size", shm_size)
    pods = PodOptions(
        scheduler=scheduler,
        shm_size=shm_size,
        read_only_root_fs=cfg.get("read_only_root_fs") is not False,
        outputs_claim=claim,
        outputs_path=path,
        node_selector=parse_node_selector(scheduler, _items(cfg, "node_selector")),
        tolerations=parse_tolerations(scheduler, _items(cfg, "tolerations")),
        secret_env=parse_secret_env(scheduler, _items(cfg, "secret_env")),
        secret_volumes=parse_secret_volumes(scheduler, _items(cfg, "secret_volumes")),
        image_pull_secrets=[check_subdomain(scheduler, "image_pull_secrets", s)
                            for s in _items(cfg, "image_pull_secrets")],
        termination_grace_s=grace,
    )
    shapes = parse_node_shapes(scheduler, _items(cfg, "node_shapes"))
    for role in app.roles:
        r = role.resource
        check_fits(scheduler, role.name, r.cpu, r.memMB, r.gpu, shapes)
    return pods


def _items(cfg: Mapping[str, Any], key: str) -> list[str]:
    """The non-empty items of list option ``key`` (none when unset)."""
    return [v for v in (cfg.get(key) or []) if v]


def _add_volume(opts: PodOptions, spec: Pod, container: Pod, volume: Pod, path: str,
                read_only: bool) -> None:
    mounts = container.setdefault("volumeMounts", [])
    taken = {m["mountPath"].rstrip("/") or "/" for m in mounts}
    if path in taken:
        raise refuse(opts.scheduler, f"two volumes mount at {path}; move one of them (--mounts, "
                     "secret_volumes or checkpoint_pvc)")
    spec.setdefault("volumes", []).append(volume)
    mounts.append({"name": volume["name"], "mountPath": path, "readOnly": read_only})


def _size_shm(spec: Pod, container: Pod, opts: PodOptions, processes: int) -> None:
    """Size the /dev/shm volume: ``shm_size``, else the rule of the module docstring."""
    scheduler = opts.scheduler
    limit = container.get("resources", {}).get("limits", {}).get("memory")
    limit_bytes = None if limit is None else parse_quantity(scheduler, "memory limit", limit)
    if opts.shm_size is not None:
        size = opts.shm_size
        if limit_bytes is not None and parse_quantity(scheduler, "shm_size", size) > limit_bytes:
            raise refuse(scheduler, f"shm_size={size} exceeds the pod's memory limit {limit} "
                         "(/dev/shm counts against it); lower shm_size or raise --memMB")
    else:
        wanted = SHM_FLOOR + processes * SHM_PER_PROCESS
        size = limit if limit_bytes is not None and wanted > limit_bytes else shm_quantity(wanted)
    shm_mounts = {m["name"] for m in container.get("volumeMounts", [])
                  if m["mountPath"] == "/dev/shm"}
    for volume in spec.get("volumes", []):
        if volume["name"] in shm_mounts:
            volume["emptyDir"] = {"medium": "Memory", "sizeLimit": size}


def _merge_node_selector(opts: PodOptions, spec: Pod) -> None:
    current = spec.get("nodeSelector") or {}
    for key, value in opts.node_selector.items():
        if current.get(key, value) != value:
            raise refuse(opts.scheduler, f"node_selector {key}:{value} contradicts "
                         f"{key}:{current[key]} from the named resource (-h); drop one of them")
    if current or opts.node_selector:
        spec["nodeSelector"] = {**current, **opts.node_selector}


def _secret_env(container: Pod, secrets: list[SecretEnv]) -> None:
    for s in secrets:
        if s.var is None:
            container.setdefault("envFrom", []).append({"secretRef": {"name": s.secret}})
        else:
            container.setdefault("env", []).append(
                {"name": s.var, "valueFrom": {"secretKeyRef": {"name": s.secret, "key": s.key}}})


def _check_template(opts: PodOptions, spec: Pod, container: Pod) -> None:
    """Raise for what the hardened pod forbids: a privileged container, a host path."""
    if (container.get("securityContext") or {}).get("privileged"):
        raise refuse(opts.scheduler, "device mounts (type=device) need a privileged container, "
                     "which the hardened pod forbids; request devices through a device plugin "
                     "(--gpu, -h) instead")
    for volume in spec.get("volumes", []):
        if "hostPath" in volume:
            raise refuse(opts.scheduler, f"--mounts type=bind ({volume['hostPath']['path']}) "
                         "mounts a host path, which the hardened pod (and k8s/base's restricted "
                         "namespace) forbids; mount a claim instead: "
                         "type=volume,src=CLAIM,dst=/PATH")
        if "persistentVolumeClaim" in volume:
            check_subdomain(opts.scheduler, "--mounts src",
                            volume["persistentVolumeClaim"]["claimName"])


def customize_pod(template: Pod, opts: PodOptions, processes: int) -> Pod:
    """A copy of ``template`` (one task's pod, whose container runs ``processes`` processes:
    :func:`processes_per_pod`) with every option of ``opts`` applied."""
    pod = copy.deepcopy(template)
    spec = pod["spec"]
    container = spec["containers"][0]
    _check_template(opts, spec, container)
    _size_shm(spec, container, opts, processes)
    writable = {"tmp": "/tmp", "home": HOME_DIR} if opts.read_only_root_fs else {}
    for name, path in writable.items():
        _add_volume(opts, spec, container, {"name": name, "emptyDir": {}}, path,
                    read_only=False)
    outputs: Pod = ({"persistentVolumeClaim": {"claimName": opts.outputs_claim}}
                    if opts.outputs_claim else {"emptyDir": {}})
    _add_volume(opts, spec, container, {"name": "outputs", **outputs}, opts.outputs_path,
                read_only=False)
    for i, (secret, path) in enumerate(opts.secret_volumes):
        volume = {"name": f"secret-{i}", "secret": {"secretName": secret, "defaultMode": 0o440}}
        _add_volume(opts, spec, container, volume, path, read_only=True)
    _secret_env(container, opts.secret_env)
    _merge_node_selector(opts, spec)
    if opts.tolerations:
        spec["tolerations"] = list(opts.tolerations)
    if opts.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in opts.image_pull_secrets]
    spec["automountServiceAccountToken"] = False
    spec["terminationGracePeriodSeconds"] = opts.termination_grace_s
    spec["securityContext"] = pod_security_context()
    container["securityContext"] = container_security_context(opts.read_only_root_fs)
    return pod


def check_fits(scheduler: str, role: str, cpu: float, mem_mb: int, gpu: int,
               shapes: list[NodeShape]) -> None:
    """Raise unless one of ``shapes`` holds a pod of ``role`` (torchx's ``M`` is 10**6 bytes)."""
    if not shapes or any(cpu <= s.cpu and mem_mb * 10**6 <= s.memory and gpu <= s.gpu
                         for s in shapes):
        return
    largest = max(shapes, key=lambda s: (s.gpu, s.cpu, s.memory))
    raise refuse(scheduler, f"role {role} asks each pod for {cpu:g} CPUs, {mem_mb}M memory and "
                 f"{gpu} GPUs, which no node in node_shapes offers (largest: {largest}); lower "
                 "--cpu, --memMB or --gpu, spread the job over more nodes (-j), or pick a named "
                 "resource (-h) that fits")

"""Run one job's pods as local containers (podman or docker), as Kubernetes would start them.

A scheduler's renderer (tests/support/volcano_local.py for Volcano Jobs,
tests/support/jobset_local.py for JobSets) turns the rendered object into :class:`Pod` values:
names, host names, env, and the job's policies. This module runs them, each as one container on
one network, reachable by its host name and its fully qualified name (``--network-alias``).

The container's command, args, env and workingDir come from the pod template generically:
``readOnlyRootFilesystem`` becomes ``--read-only``, ``runAsUser`` and ``runAsGroup`` become
``--user``, ``runAsNonRoot`` is checked against the image's user as the kubelet would, emptyDir
volumes become tmpfs mounts (``/dev/shm`` becomes ``--shm-size``) and each
persistentVolumeClaim becomes one host directory shared by every pod (a ReadWriteMany volume,
made writable for any uid in place of ``fsGroup``). Resource requests and limits are not
reproduced; any other volume kind, ``subPath``, env ``valueFrom`` other than the pod's name and
namespace, or more than one container raises UnsupportedPod.

:func:`run_pods` applies the job's lifecycle policies as the job's controller does: a pod that
exits non-zero is the event PodFailed, :class:`Eviction` (``<engine> stop`` with the pod's
``terminationGracePeriodSeconds``: SIGTERM, then SIGKILL, as the kubelet ends a deleted pod) is
PodEvicted; the action the pod's policies give the event runs: a restart action
(:data:`RESTART_ACTIONS`: Volcano's ``RestartJob``, JobSet's ``RestartJobSet``) stops every pod
with its grace period and starts them all again, failing the job instead once the restarts reach
``max_retry``; an ending action (:data:`ENDING_ACTIONS`) stops every pod and ends the job. An
event without a policy changes nothing (an evicted pod is not created again on its own).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REQUEST_MARKER = "=== SCHEDULER REQUEST ==="
# Kubernetes' terminationGracePeriodSeconds when the pod sets none.
DEFAULT_GRACE_S = 30
ENDING_ACTIONS = {"TerminateJob": "Terminated", "AbortJob": "Aborted", "CompleteJob": "Completed"}
RESTART_ACTIONS = ("RestartJob", "RestartJobSet")
# The network name that runs pods on the host's network (no network is created).
HOST_NETWORK = "host"


def dryrun_request(dryrun_output: str) -> Any:
    """The object printed after ``=== SCHEDULER REQUEST ===`` by ``torchx run --dryrun``."""
    if REQUEST_MARKER not in dryrun_output:
        raise ValueError(f"no {REQUEST_MARKER!r} section in the dry-run output")
    return yaml.safe_load(dryrun_output.split(REQUEST_MARKER, 1)[1])


class UnsupportedPod(ValueError):
    """The rendered pod uses something these local containers cannot reproduce."""


@dataclass(frozen=True)
class Mount:
    """One mount of a pod's container: ``kind`` is "tmpfs", "shm" or "claim"."""

    path: str
    kind: str
    source: str = ""  # the claim name for "claim"
    read_only: bool = False
    size: str = ""  # sizeLimit of an emptyDir, e.g. "1Gi"


@dataclass(frozen=True)
class Pod:
    """What one task replica's container runs, as the cluster would run it."""

    name: str
    fqdn: str
    image: str
    command: list[str]
    env: dict[str, str]
    working_dir: str | None = None
    read_only_root: bool = False
    user: str | None = None
    run_as_non_root: bool = False
    mounts: list[Mount] = field(default_factory=list)
    grace_s: int = DEFAULT_GRACE_S
    policies: dict[str, str] = field(default_factory=dict)  # event -> action


def container_env(container: dict[str, Any], pod_name: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = str(var["value"])
            continue
        field_path = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        values = {"metadata.name": pod_name, "metadata.namespace": "default"}
        if field_path not in values:
            raise UnsupportedPod(f"env {var['name']}: only value and fieldRef "
                                 f"{sorted(values)} are reproduced locally")
        env[var["name"]] = values[field_path]
    return env


def _security(spec: dict[str, Any], container: dict[str, Any]) -> tuple[bool, str | None, bool]:
    """(read-only root, --user value, runAsNonRoot): the container's context over the pod's."""
    merged = {**(spec.get("securityContext") or {}), **(container.get("securityContext") or {})}
    user = merged.get("runAsUser")
    group = merged.get("runAsGroup")
    user_arg = None if user is None else f"{user}:{group}" if group is not None else str(user)
    if user is None and group is not None:
        raise UnsupportedPod("runAsGroup without runAsUser is not reproduced locally")
    return bool(merged.get("readOnlyRootFilesystem")), user_arg, bool(merged.get("runAsNonRoot"))


def _mounts(spec: dict[str, Any], container: dict[str, Any]) -> list[Mount]:
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    mounts = []
    for vm in container.get("volumeMounts") or []:
        volume = volumes.get(vm["name"])
        if volume is None:
            raise UnsupportedPod(f"volumeMount {vm['name']} names no volume of the pod")
        if vm.get("subPath"):
            raise UnsupportedPod(f"volumeMount {vm['name']}: subPath is not reproduced locally")
        read_only = bool(vm.get("readOnly"))
        if "emptyDir" in volume:
            size = str((volume["emptyDir"] or {}).get("sizeLimit", ""))
            kind = "shm" if vm["mountPath"] == "/dev/shm" else "tmpfs"
            mounts.append(Mount(vm["mountPath"], kind, read_only=read_only, size=size))
        elif "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            mounts.append(Mount(vm["mountPath"], "claim", source=claim, read_only=read_only))
        else:
            kinds = sorted(set(volume) - {"name"})
            raise UnsupportedPod(f"volume {vm['name']} ({', '.join(kinds)}): only emptyDir and "
                                 "persistentVolumeClaim are reproduced locally")
    return mounts


def pod_from_spec(name: str, fqdn: str, spec: dict[str, Any], env: dict[str, str],
                  policies: dict[str, str],
                  expand: Callable[[str, dict[str, str]], str] | None = None) -> Pod:
    """Pod ``name`` (host name; ``fqdn`` its qualified name) of pod spec ``spec``: the
    container's env after ``env`` (what the controller adds), ``policies`` (event -> action);
    ``expand(text, env)`` rewrites the command's items (Kubernetes' ``$(VAR)`` references)."""
    if len(spec["containers"]) != 1 or spec.get("initContainers"):
        raise UnsupportedPod(f"{name}: only pods of one container are reproduced locally")
    container = spec["containers"][0]
    read_only, user, non_root = _security(spec, container)
    full_env = {**env, **container_env(container, name)}
    command = [*(container.get("command") or []), *(container.get("args") or [])]
    if expand is not None:
        command = [expand(item, full_env) for item in command]
    return Pod(
        name=name, fqdn=fqdn, image=container["image"], command=command, env=full_env,
        working_dir=container.get("workingDir"), read_only_root=read_only, user=user,
        run_as_non_root=non_root, mounts=_mounts(spec, container),
        grace_s=spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S), policies=policies)


def run_args(engine: str, pod: Pod, network: str, claims: Path,
             binds: dict[str, Path] | None = None, hosts: list[str] | None = None) -> list[str]:
    """The ``<engine> run`` command that starts ``pod`` detached on ``network``.

    Claims are the subdirectories of ``claims`` named after them (created by the caller);
    ``binds`` (container path -> host directory) are added where the pod mounts nothing. On
    :data:`HOST_NETWORK` (where pods reach what listens on the host's loopback, such as the
    tests' S3 server) the names in ``hosts`` resolve to 127.0.0.1 instead of being aliases.
    """
    args = [engine, "run", "-d", "--name", pod.name, "--hostname", pod.name,
            "--network", network]
    if network == HOST_NETWORK:  # its own names first: what the loopback's reverse lookup
        own = [pod.name, pod.fqdn]  # returns, so that each pod's FQDN is its own (torchrun)
        args += [f"--add-host={host}:127.0.0.1"
                 for host in [*own, *(h for h in hosts or [] if h not in own)]]
    else:
        args += ["--network-alias", pod.fqdn, "--network-alias", pod.name]
    for key, value in pod.env.items():
        args += ["--env", f"{key}={value}"]
    if pod.working_dir:
        args += ["--workdir", pod.working_dir]
    if pod.read_only_root:
        args.append("--read-only")
    if pod.user:
        args += ["--user", pod.user]
    for mount in pod.mounts:
        if mount.kind == "shm":
            args += ["--shm-size", _docker_size(mount.size) if mount.size else "1g"]
        elif mount.kind == "tmpfs":
            size = f",size={_docker_size(mount.size)}" if mount.size else ""
            args += ["--tmpfs", f"{mount.path}:{'ro' if mount.read_only else 'rw'},exec,"
                                f"mode=1777{size}"]
        else:
            suffix = ":ro" if mount.read_only else ""
            args += ["--volume", f"{claims / mount.source}:{mount.path}{suffix}"]
    mounted = {mount.path.rstrip("/") for mount in pod.mounts}
    for path, host in (binds or {}).items():
        if path.rstrip("/") not in mounted:
            args += ["--volume", f"{host}:{path}"]
    return [*args, pod.image, *pod.command]


def _docker_size(quantity: str) -> str:
    """A Kubernetes quantity (``1Gi``, ``512Mi``, ``1G``) as a docker/podman size (bytes)."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "": 1}
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T|)", quantity)
    if match is None:
        raise UnsupportedPod(f"size {quantity!r}: not a quantity reproduced locally")
    return str(int(match[1]) * units[match[2]])


def check_non_root(engine: str, pod: Pod) -> None:
    """Refuse a runAsNonRoot pod whose user is not a numeric non-zero uid (as the kubelet does)."""
    if not pod.run_as_non_root:
        return
    user = pod.user or subprocess.run(
        [engine, "image", "inspect", "--format", "{{.Config.User}}", pod.image],
        capture_output=True, text=True, check=True).stdout.strip()
    uid = user.split(":", 1)[0]
    if not uid.isdigit() or int(uid) == 0:
        raise UnsupportedPod(f"{pod.name}: runAsNonRoot, but the user is {user or 'root'!r}; "
                             "the kubelet refuses to start it (needs a numeric non-zero uid)")


@dataclass(frozen=True)
class PodResult:
    name: str
    exit_code: int
    logs: str


@dataclass(frozen=True)
class Eviction:
    """Evict pod ``pod`` in the job's first run once ``ready()`` is true (asked every 0.2 s)."""

    pod: str
    ready: Callable[[], bool]


@dataclass
class JobResult:
    """How a job ended: Volcano's ``phase`` (Completed, Failed, Terminated, Aborted), its
    restarts, each run's pods, and (monotonic seconds) when the eviction came, when that run's
    pods had all exited, and when the next run's pods were started."""

    phase: str
    retries: int = 0
    runs: list[list[PodResult]] = field(default_factory=list)
    evicted_at: float | None = None
    stopped_at: float | None = None
    restarted_at: float | None = None


def _prepare(engine: str, job_pods: list[Pod], claims: Path, binds: dict[str, Path]) -> None:
    for pod in job_pods:
        check_non_root(engine, pod)
        for mount in pod.mounts:
            if mount.kind == "claim":
                (claims / mount.source).mkdir(parents=True, exist_ok=True)
                (claims / mount.source).chmod(0o777)
    for host in binds.values():
        host.mkdir(parents=True, exist_ok=True)
        host.chmod(0o777)


def _exited(engine: str, job_pods: list[Pod]) -> dict[str, int]:
    """Exit code of each pod whose container has exited."""
    out = subprocess.run([engine, "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                          *[p.name for p in job_pods]], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return {pod.name: int(line.split()[1]) for pod, line in zip(job_pods, out, strict=True)
            if line.split()[0] in ("exited", "stopped")}


def _stop(engine: str, job_pods: list[Pod]) -> None:
    """Stop every pod at once, each with its grace period (SIGTERM, SIGKILL after it)."""
    procs = [subprocess.Popen([engine, "stop", "-t", str(p.grace_s), p.name],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for p in job_pods]
    for proc in procs:
        proc.wait()


def _run_once(engine: str, job_pods: list[Pod], eviction: Eviction | None, deadline: float,
              result: JobResult) -> str | None:
    """Watch the started pods until all have exited (None) or an event has a policy; then
    return its action (the pods still run, the evicted one too)."""
    by_name = {p.name: p for p in job_pods}
    while time.monotonic() < deadline:
        if eviction is not None and result.evicted_at is None and eviction.ready():
            result.evicted_at = time.monotonic()
            pod = by_name[eviction.pod]
            if "PodEvicted" in pod.policies:  # every pod is stopped for the action
                return pod.policies["PodEvicted"]
            _stop(engine, [pod])
        exited = _exited(engine, job_pods)
        for name, code in exited.items():
            if code != 0 and "PodFailed" in by_name[name].policies:
                return by_name[name].policies["PodFailed"]
        if len(exited) == len(job_pods):
            return None
        time.sleep(0.2)
    raise TimeoutError("the job's pods did not finish in time")


def run_pods(engine: str, job_pods: list[Pod], max_retry: int, network: str, claims: Path,
             binds: dict[str, Path] | None = None, timeout: float = 600,
             eviction: Eviction | None = None) -> JobResult:
    """Run ``job_pods`` (one job's) on a fresh ``network`` under their policies (module
    docstring) until the job ends, failing it once its restarts would reach ``max_retry``;
    ``eviction`` evicts one pod of the first run. Containers and network are removed
    afterwards; on :data:`HOST_NETWORK` every pod's names resolve to the host's loopback.
    ``claims`` and ``binds`` as in :func:`run_args`; their host directories are made writable
    for the pods' users."""
    _prepare(engine, job_pods, claims, binds or {})
    deadline = time.monotonic() + timeout
    result = JobResult(phase="Running")
    hosts = [name for pod in job_pods for name in (pod.name, pod.fqdn)]
    if network != HOST_NETWORK:
        subprocess.run([engine, "network", "create", network], check=True, capture_output=True)
    try:
        while True:
            for pod in job_pods:
                subprocess.run(run_args(engine, pod, network, claims, binds, hosts), check=True,
                               capture_output=True, text=True)
            if result.evicted_at is not None and result.restarted_at is None:
                result.restarted_at = time.monotonic()
            action = _run_once(engine, job_pods, eviction if not result.runs else None,
                               deadline, result)
            if action is not None:
                _stop(engine, job_pods)
            if result.evicted_at is not None and result.stopped_at is None:
                result.stopped_at = time.monotonic()
            codes = _exited(engine, job_pods)
            run = []
            for pod in job_pods:
                logs = subprocess.run([engine, "logs", pod.name], capture_output=True, text=True)
                run.append(PodResult(pod.name, codes[pod.name], logs.stdout + logs.stderr))
                subprocess.run([engine, "rm", "-f", pod.name], capture_output=True)
            result.runs.append(run)
            if action is None:
                result.phase = "Completed" if all(r.exit_code == 0 for r in run) else "Failed"
                return result
            if action in ENDING_ACTIONS:
                result.phase = ENDING_ACTIONS[action]
                return result
            if action not in RESTART_ACTIONS:
                raise UnsupportedPod(f"policy action {action} is not reproduced locally")
            if result.retries + 1 >= max_retry:  # the restarts counted after this one
                result.phase = "Failed"
                return result
            result.retries += 1
    finally:
        for pod in job_pods:
            subprocess.run([engine, "rm", "-f", pod.name], capture_output=True)
        if network != HOST_NETWORK:
            subprocess.run([engine, "network", "rm", "-f", network], capture_output=True)

"""TorchX's kubernetes (Volcano) scheduler with the pod options this repository's jobs need.

Registered as ``kubernetes`` under the ``torchx.schedulers`` entry points (pyproject.toml), so
``torchx run -s kubernetes`` uses it. It adds run options (``torchx runopts kubernetes``) for
node selectors, tolerations, secrets, the checkpoint claim, /dev/shm size, image pull secrets,
node shapes, the read-only root file system and the termination grace period, and post-processes
the Volcano Job that TorchX renders: every pod gets the hardened security context of
:mod:`components.schedulers.k8s_pod`, and the job the restart policy of
:mod:`components.schedulers.k8s_preemption` (an evicted or failed pod restarts the whole job, at
most ``--max_retries`` times).
Bad options raise :class:`components.launch.ComponentArgumentError` before anything is
submitted; ``torchx run`` prints that one line and exits 1.

``validate_spec=True`` asks the API server for a dry run of the job: TorchX main's option,
which this scheduler also offers on torchx 0.7.0 and turns off by default on both (TorchX main
turns it on, so that ``torchx run --dryrun`` would need a cluster). The server is asked about
the job as submitted, after the pod changes; a refusal or no answer is one line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, List, cast  # noqa: UP035 (torchx matches typing.List[str] exactly)

from torchx.schedulers.api import AppDryRunInfo
from torchx.schedulers.kubernetes_scheduler import (
    KubernetesJob,
    KubernetesOpts,
    sanitize_for_serialization,
)
from torchx.schedulers.kubernetes_scheduler import KubernetesScheduler as _TorchXKubernetes
from torchx.specs import AppDef, Role, runopts
from torchx.specs.api import CfgVal

from components.errors import ComponentArgumentError
from components.schedulers import k8s_options as opt
from components.schedulers.k8s_pod import OUTPUTS_DIR, PodOptions, check_fits, customize_pod
from components.schedulers.k8s_preemption import (
    DEFAULT_TERMINATION_GRACE_S,
    TERMINATION_GRACE_HELP,
    check_termination_grace,
    restart_policy,
)
from components.schedulers.run_options import StrictRunOptions
from components.torchx_compat import replace_cfg

DEFAULT_SHM_SIZE = "1Gi"
LIST = List[str]  # noqa: UP006 (runopts compares option types with typing.List[str])

# (name, type, default, help) of the options added to TorchX's; lists are ';'-separated.
_EXTRA_OPTS: list[tuple[str, Any, CfgVal, str]] = [
    ("node_selector", LIST, None,
     "KEY:VALUE node labels every pod requires, e.g. node.kubernetes.io/instance-type:m5.2xlarge"),
    ("tolerations", LIST, None,
     "KEY:EFFECT (Exists) or KEY:VALUE:EFFECT (Equal) taints to tolerate, "
     "e.g. nvidia.com/gpu:NoSchedule"),
    ("secret_env", LIST, None,
     "secrets as environment: VAR:SECRET:KEY for one key, SECRET for every key"),
    ("secret_volumes", LIST, None, "secrets as read-only files: SECRET:/MOUNT/PATH"),
    ("checkpoint_pvc", str, None,
     f"CLAIM[:PATH]: PersistentVolumeClaim mounted where trainers write outputs and "
     f"checkpoints (default path {OUTPUTS_DIR}); without it they go to an emptyDir and are "
     "lost with the pod"),
    ("shm_size", str, DEFAULT_SHM_SIZE,
     "size of /dev/shm (a memory emptyDir counted against the pod's memory limit)"),
    ("image_pull_secrets", LIST, None, "secrets for pulling the image from a registry"),
    ("read_only_root_fs", bool, True,
     "mount the container's root file system read-only (writable: outputs, /tmp, HOME)"),
    ("node_shapes", LIST, None,
     "CPUS/MEMORY[/GPUS] of the cluster's nodes, e.g. 8/32Gi;96/1100Gi/8: a job whose pods "
     "fit none is refused before submission"),
    ("termination_grace_s", int, DEFAULT_TERMINATION_GRACE_S, TERMINATION_GRACE_HELP),
]


def _list(cfg: Mapping[str, Any], key: str) -> list[str]:
    """The non-empty items of list option ``key`` (none when unset)."""
    return [v for v in (cfg.get(key) or []) if v]


def pod_options(cfg: KubernetesOpts, app: AppDef) -> PodOptions:
    """The run options of ``cfg`` parsed and checked into :class:`PodOptions` for the pods of
    ``app``."""
    raw = cast(dict[str, Any], cfg)
    grace = raw.get("termination_grace_s")
    grace = DEFAULT_TERMINATION_GRACE_S if grace is None else grace
    for role in app.roles:
        check_termination_grace(grace, role.env.get("PET_SHUTDOWN_TIMEOUT"))
    shm_size = raw.get("shm_size") or DEFAULT_SHM_SIZE
    claim, path = (opt.parse_pvc(raw["checkpoint_pvc"], OUTPUTS_DIR) if raw.get("checkpoint_pvc")
                   else (None, OUTPUTS_DIR))
    return PodOptions(
        shm_bytes=opt.parse_quantity("shm_size", shm_size),
        shm_size=shm_size,
        read_only_root_fs=raw.get("read_only_root_fs") is not False,
        outputs_claim=claim,
        outputs_path=path,
        node_selector=opt.parse_node_selector(_list(raw, "node_selector")),
        tolerations=opt.parse_tolerations(_list(raw, "tolerations")),
        secret_env=opt.parse_secret_env(_list(raw, "secret_env")),
        secret_volumes=opt.parse_secret_volumes(_list(raw, "secret_volumes")),
        image_pull_secrets=[opt.check_subdomain("image_pull_secrets", s)
                            for s in _list(raw, "image_pull_secrets")],
        termination_grace_s=grace,
    )


def check_cfg_names(cfg: KubernetesOpts) -> None:
    """Raise unless a queue is given and the queue, namespace and other object names are valid."""
    queue = cfg.get("queue")
    if not queue:
        raise ComponentArgumentError(
            "kubernetes: no Volcano queue given; pass -cfg queue=torchx-templates (the queue "
            "k8s/ creates) or set queue in .torchxconfig's [kubernetes] section")
    opt.check_subdomain("queue", queue)
    opt.check_label("namespace", cfg.get("namespace") or "default")
    for key in ("service_account", "priority_class"):
        if cfg.get(key):
            opt.check_subdomain(key, cast(str, cfg.get(key)))


def check_job_names(job: dict[str, Any]) -> None:
    """Raise unless the rendered job's name and its pods' host names are DNS-1123 labels."""
    name = job["metadata"]["name"]
    # Volcano names each pod (and, under the svc plugin, its host name) JOB-TASK-INDEX.
    hosts = [f"{name}-{task['name']}-0" for task in job["spec"]["tasks"]]
    for what, value in [("job name", name)] + [("pod hostname", h) for h in hosts]:
        if not opt.is_dns1123_label(value):
            raise ComponentArgumentError(
                f"kubernetes: {what} {value!r} ({len(value)} characters) is not a DNS-1123 "
                "label of at most 63; shorten the app and role names (TorchX appends an id of up "
                "to 14 characters to the app name)")


class KubernetesScheduler(StrictRunOptions, _TorchXKubernetes):
    """TorchX's kubernetes scheduler plus this repository's pod options and hardening."""

    registered_as = "kubernetes"

    def _run_opts(self) -> runopts:
        opts = super()._run_opts()
        # Checked in _submit_dryrun instead, so a missing queue is one line, not a usage dump.
        opts.add("queue", type_=str,
                 help="Volcano queue to schedule the job in (required), e.g. torchx-templates")
        for name, type_, default, help_ in _EXTRA_OPTS:
            opts.add(name, type_=type_, default=default, help=help_)
        # TorchX main's option, on by default there (a --dryrun then needs a cluster); off here
        # on both versions, so that a dry run renders without one, as README's commands do
        opts.add("validate_spec", type_=bool, default=False,
                 help="ask the API server for a dry run of the job (as submitted, with the pod "
                      "options applied) before submitting it")
        return opts

    def build_workspace_and_update_role(self, role: Role, workspace: str,
                                        cfg: Mapping[str, CfgVal]) -> None:
        """TorchX's image patch of the workspace on top of ``--image``; one line when no Docker
        API answers (TorchX ends in a DockerException traceback)."""
        from docker.errors import DockerException

        try:
            super().build_workspace_and_update_role(role, workspace, cfg)
        except DockerException as err:
            host = os.environ.get("DOCKER_HOST", "the default socket")
            raise ComponentArgumentError(
                f"kubernetes: --workspace {workspace} is built into an image on top of --image "
                f"through a Docker API, and none answers at {host} ({type(err).__name__}); pass "
                "--workspace \"\" to run --image as built (images/build), or start Docker (or "
                "run .ci/podman-up and export DOCKER_HOST=unix:///run/podman/podman.sock)"
            ) from None

    def _submit_dryrun(self, app: AppDef, cfg: KubernetesOpts) -> AppDryRunInfo[KubernetesJob]:
        check_cfg_names(cfg)
        pods = pod_options(cfg, app)
        shapes = opt.parse_node_shapes(_list(cast(Mapping[str, Any], cfg), "node_shapes"))
        for role in app.roles:
            r = role.resource
            check_fits(role.name, r.cpu, r.memMB, r.gpu, shapes)
        # rendered without TorchX main's validate_spec: the job is validated below, as submitted
        base = super()._submit_dryrun(app, replace_cfg(cfg, validate_spec=False))
        job = cast(dict[str, Any], sanitize_for_serialization(base.request.resource))
        check_job_names(job)
        for task in job["spec"]["tasks"]:
            task["template"] = customize_pod(task["template"], pods)
            # TorchX's per-task policies and maxRetry give way to the job's (restart_policy)
            task.pop("policies", None)
            task.pop("maxRetry", None)
        job["spec"].update(restart_policy(min(role.max_retries for role in app.roles)))
        if cfg.get("validate_spec"):
            self._validate_on_server(job, cast(str, cfg.get("namespace") or "default"))
        request = KubernetesJob(images_to_push=base.request.images_to_push, resource=job)
        return AppDryRunInfo(request, repr)

    def _validate_on_server(self, job: dict[str, Any], namespace: str) -> None:
        """The API server's dry run of creating ``job`` (``validate_spec``); one line if it
        refuses the job or does not answer."""
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        try:
            self._custom_objects_api().create_namespaced_custom_object(
                group="batch.volcano.sh", version="v1alpha1", namespace=namespace,
                plural="jobs", body=job, dry_run="All")
        except ApiException as err:
            try:
                reason = json.loads(err.body)["message"]
            except (TypeError, ValueError, KeyError):
                reason = err.reason
            raise ComponentArgumentError(
                f"kubernetes: the API server refuses the job ({err.status}: "
                f"{' '.join(str(reason).split())}); fix what it names, or pass "
                "-cfg validate_spec=False to skip the check") from None
        except (HTTPError, OSError) as err:
            raise ComponentArgumentError(
                f"kubernetes: validate_spec: no Kubernetes API server answers "
                f"({type(err).__name__}); check the kube config (kubectl cluster-info), or pass "
                "-cfg validate_spec=False to render the job without a cluster") from None


def create_scheduler(session_name: str, **kwargs: Any) -> KubernetesScheduler:
    """The entry point TorchX calls (``client``/``docker_client`` pass through, for tests)."""
    return KubernetesScheduler(session_name, client=kwargs.get("client"),
                               docker_client=kwargs.get("docker_client"))

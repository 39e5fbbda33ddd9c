"""What both Kubernetes schedulers of this repository share: the pod run options, their
parsing and checks, the one-line workspace error and the API server's dry run.

``kubernetes`` (Volcano, :mod:`components.schedulers.kubernetes_volcano`) and
``kubernetes_jobset`` (JobSet admitted by Kueue, :mod:`components.schedulers.kubernetes_jobset`)
mix in :class:`HardenedPods` before TorchX's ``KubernetesScheduler``: every option of
:data:`POD_OPTS` is offered by both, parsed by :func:`pod_options` into the
:class:`~components.schedulers.k8s_pod.PodOptions` that
:func:`~components.schedulers.k8s_pod.customize_pod` applies to each pod template.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, List, cast  # noqa: UP035 (torchx matches typing.List[str] exactly)

from torchx.specs import AppDef, Role, runopts
from torchx.specs.api import CfgVal

from components.errors import ComponentArgumentError
from components.schedulers import k8s_options as opt
from components.schedulers.k8s_pod import OUTPUTS_DIR, PodOptions, check_fits
from components.schedulers.k8s_preemption import (
    DEFAULT_TERMINATION_GRACE_S,
    TERMINATION_GRACE_HELP,
    check_termination_grace,
)

DEFAULT_SHM_SIZE = "1Gi"
LIST = List[str]  # noqa: UP006 (runopts compares option types with typing.List[str])

# (name, type, default, help) of the pod options added to TorchX's; lists are ';'-separated.
POD_OPTS: list[tuple[str, Any, CfgVal, str]] = [
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


def list_option(cfg: Mapping[str, Any], key: str) -> list[str]:
    """The non-empty items of list option ``key`` (none when unset)."""
    return [v for v in (cfg.get(key) or []) if v]


def pod_options(cfg: Mapping[str, Any], app: AppDef) -> PodOptions:
    """The run options of ``cfg`` parsed and checked into :class:`PodOptions` for the pods of
    ``app``; raises ComponentArgumentError (one line) for a bad one, or for a role whose pods
    fit none of ``node_shapes``."""
    grace = cfg.get("termination_grace_s")
    grace = DEFAULT_TERMINATION_GRACE_S if grace is None else grace
    for role in app.roles:
        check_termination_grace(grace, role.env.get("PET_SHUTDOWN_TIMEOUT"))
    shm_size = cfg.get("shm_size") or DEFAULT_SHM_SIZE
    claim, path = (opt.parse_pvc(cfg["checkpoint_pvc"], OUTPUTS_DIR) if cfg.get("checkpoint_pvc")
                   else (None, OUTPUTS_DIR))
    pods = PodOptions(
        shm_bytes=opt.parse_quantity("shm_size", shm_size),
        shm_size=shm_size,
        read_only_root_fs=cfg.get("read_only_root_fs") is not False,
        outputs_claim=claim,
        outputs_path=path,
        node_selector=opt.parse_node_selector(list_option(cfg, "node_selector")),
        tolerations=opt.parse_tolerations(list_option(cfg, "tolerations")),
        secret_env=opt.parse_secret_env(list_option(cfg, "secret_env")),
        secret_volumes=opt.parse_secret_volumes(list_option(cfg, "secret_volumes")),
        image_pull_secrets=[opt.check_subdomain("image_pull_secrets", s)
                            for s in list_option(cfg, "image_pull_secrets")],
        termination_grace_s=grace,
    )
    shapes = opt.parse_node_shapes(list_option(cfg, "node_shapes"))
    for role in app.roles:
        r = role.resource
        check_fits(role.name, r.cpu, r.memMB, r.gpu, shapes)
    return pods


# The longest id TorchX's ``make_unique`` appends to the app name: ``random_id`` spells a 64-bit
# value in base 20 (first character) then base 29, and 20 * 29**12 < 2**64 <= 20 * 29**13.
MAX_APP_ID_CHARS = 14


def check_derived_names(scheduler: str, job_name: str, names: list[tuple[str, str]]) -> None:
    """Raise unless each of ``names`` ((what, value) pairs, each value starting with
    ``job_name``, TorchX's APP-ID) stays a DNS-1123 label with the longest id TorchX can append.

    Checked at that length, not at this submit's random id, so that the same app and role names
    are accepted or refused on every submit."""
    pad = "x" * (MAX_APP_ID_CHARS - len(job_name.rsplit("-", 1)[-1]))
    for what, value in names:
        longest = job_name + pad + value[len(job_name):]
        if not opt.is_dns1123_label(longest):
            raise ComponentArgumentError(
                f"{scheduler}: {what} {value!r} can reach {len(longest)} characters, over the 63 "
                "of a DNS-1123 label (TorchX appends an id of up to "
                f"{MAX_APP_ID_CHARS} characters to the app name); shorten the app or role names")


def check_object_names(cfg: Mapping[str, Any]) -> None:
    """Raise unless the namespace is a DNS-1123 label and the service account and priority
    class (when given) are DNS-1123 subdomains."""
    opt.check_label("namespace", cfg.get("namespace") or "default")
    for key in ("service_account", "priority_class"):
        if cfg.get(key):
            opt.check_subdomain(key, cast(str, cfg.get(key)))


class HardenedPods:
    """Mixin for TorchX's ``KubernetesScheduler`` (listed before it): the pod options, the
    ``validate_spec`` option, a one-line error when the workspace cannot be built, and the API
    server's dry run of the object to submit. ``registered_as`` names the scheduler in errors."""

    registered_as: str

    @contextmanager
    def errors_named(self) -> Iterator[None]:
        """Within it, a :class:`~components.schedulers.k8s_options.PodOptionError` of the shared
        option parsers and pod checks is raised under this scheduler's name."""
        try:
            yield
        except opt.PodOptionError as err:
            raise ComponentArgumentError(f"{self.registered_as}: {err.detail}") from None

    def add_pod_opts(self, opts: runopts) -> None:
        """Add :data:`POD_OPTS` and ``validate_spec`` to ``opts``."""
        for name, type_, default, help_ in POD_OPTS:
            opts.add(name, type_=type_, default=default, help=help_)
        # TorchX main's option, on by default there (a --dryrun then needs a cluster); off here
        # on both versions, so that a dry run renders without one, as README's commands do
        opts.add("validate_spec", type_=bool, default=False,
                 help="ask the API server for a dry run of the job (as submitted, with the pod "
                      "options applied) before submitting it")

    def build_workspace_and_update_role(self, role: Role, workspace: str,
                                        cfg: Mapping[str, CfgVal]) -> None:
        """TorchX's image patch of the workspace on top of ``--image``; one line when no Docker
        API answers (TorchX ends in a DockerException traceback)."""
        from docker.errors import DockerException

        try:
            super().build_workspace_and_update_role(role, workspace, cfg)  # type: ignore[misc]
        except DockerException as err:
            host = os.environ.get("DOCKER_HOST", "the default socket")
            raise ComponentArgumentError(
                f"{self.registered_as}: --workspace {workspace} is built into an image on top of "
                f"--image through a Docker API, and none answers at {host} "
                f"({type(err).__name__}); pass --workspace \"\" to run --image as built "
                "(images/build), or start Docker (or run .ci/podman-up and export "
                "DOCKER_HOST=unix:///run/podman/podman.sock)"
            ) from None

    def validate_on_server(self, body: dict[str, Any], namespace: str, group: str,
                           version: str, plural: str) -> None:
        """The API server's dry run of creating custom object ``body`` (``validate_spec``); one
        line if it refuses the object or does not answer."""
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        try:
            self._custom_objects_api().create_namespaced_custom_object(  # type: ignore[attr-defined]
                group=group, version=version, namespace=namespace, plural=plural, body=body,
                dry_run="All")
        except ApiException as err:
            try:
                reason = json.loads(err.body)["message"]
            except (TypeError, ValueError, KeyError):
                reason = err.reason
            raise ComponentArgumentError(
                f"{self.registered_as}: the API server refuses the job ({err.status}: "
                f"{' '.join(str(reason).split())}); fix what it names, or pass "
                "-cfg validate_spec=False to skip the check") from None
        except (HTTPError, OSError) as err:
            raise ComponentArgumentError(
                f"{self.registered_as}: validate_spec: no Kubernetes API server answers "
                f"({type(err).__name__}); check the kube config (kubectl cluster-info), or pass "
                "-cfg validate_spec=False to render the job without a cluster") from None

"""The class both Kubernetes schedulers of this repository derive from: the pod run options,
strict ``-cfg`` reading, the one-line workspace error and the API server's dry run.

``kubernetes`` (Volcano, :mod:`components.schedulers.k8s.volcano`) and ``kubernetes_jobset``
(JobSet admitted by Kueue, :mod:`components.schedulers.k8s.jobset`) derive from
:class:`HardenedKubernetesScheduler`: every option of :data:`POD_OPTS` is offered by both,
parsed by :func:`~components.schedulers.k8s.pod.pod_options` into the
:class:`~components.schedulers.k8s.pod.PodOptions` that
:func:`~components.schedulers.k8s.pod.customize_pod` applies to each pod template. Every error
starts with the scheduler's registered name (``registered_as``), passed to each check.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, List  # noqa: UP035 (torchx matches typing.List[str] exactly)

from torchx.specs import CfgVal, Role, runopts

from components.schedulers.k8s.options import refuse
from components.schedulers.k8s.pod import OUTPUTS_DIR, SHM_RULE
from components.schedulers.k8s.preemption import (
    DEFAULT_TERMINATION_GRACE_S,
    TERMINATION_GRACE_HELP,
)
from components.schedulers.run_options import StrictRunOptions
from components.schedulers.submit import SubmitChecks
from components.schedulers.torchx_workarounds.k8s import TorchXKubernetesScheduler

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
    ("shm_size", str, None,
     "size of /dev/shm (a memory emptyDir counted against the pod's memory limit), e.g. 8Gi; "
     f"default {SHM_RULE}, at most the memory limit: room for the DataLoader workers' batches "
     "and NCCL's shared-memory buffers of every rank"),
    ("image_pull_secrets", LIST, None, "secrets for pulling the image from a registry"),
    ("read_only_root_fs", bool, True,
     "mount the container's root file system read-only (writable: outputs, /tmp, HOME)"),
    ("node_shapes", LIST, None,
     "CPUS/MEMORY[/GPUS] of the cluster's nodes, e.g. 8/32Gi;96/1100Gi/8: a job whose pods "
     "fit none is refused before submission"),
    ("termination_grace_s", int, DEFAULT_TERMINATION_GRACE_S, TERMINATION_GRACE_HELP),
]


class HardenedKubernetesScheduler(SubmitChecks, StrictRunOptions, TorchXKubernetesScheduler):
    """TorchX's ``KubernetesScheduler`` with strict run options, the pod options, the
    ``validate_spec`` option, a one-line error when the workspace cannot be built, and the API
    server's dry run of the object to submit. ``registered_as`` names the scheduler in errors."""

    registered_as: str

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
            super().build_workspace_and_update_role(role, workspace, cfg)
        except DockerException as err:
            host = os.environ.get("DOCKER_HOST", "the default socket")
            raise refuse(
                self.registered_as, f"--workspace {workspace} is built into an image on top of "
                f"--image through a Docker API, and none answers at {host} "
                f"({type(err).__name__}); pass --workspace \"\" to run --image as built "
                "(images/build), or start Docker (or run .ci/podman-up and export "
                "DOCKER_HOST=unix:///run/podman/podman.sock)") from None

    def validate_on_server(self, body: dict[str, Any], namespace: str, group: str,
                           version: str, plural: str) -> None:
        """The API server's dry run of creating custom object ``body`` (``validate_spec``); one
        line if it refuses the object or does not answer."""
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        try:
            self.custom_objects_api().create_namespaced_custom_object(
                group=group, version=version, namespace=namespace, plural=plural, body=body,
                dry_run="All")
        except ApiException as err:
            try:
                reason = json.loads(err.body)["message"]
            except (TypeError, ValueError, KeyError):
                reason = err.reason
            raise refuse(
                self.registered_as, f"the API server refuses the job ({err.status}: "
                f"{' '.join(str(reason).split())}); fix what it names, or pass "
                "-cfg validate_spec=False to skip the check") from None
        except (HTTPError, OSError) as err:
            raise refuse(
                self.registered_as, "validate_spec: no Kubernetes API server answers "
                f"({type(err).__name__}); check the kube config (kubectl cluster-info), or pass "
                "-cfg validate_spec=False to render the job without a cluster") from None

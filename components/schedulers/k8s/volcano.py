"""``kubernetes``: TorchX's kubernetes (Volcano) scheduler with the pod options this
repository's jobs need.

Registered as ``kubernetes`` under the ``torchx.schedulers`` entry points (pyproject.toml), so
``torchx run -s kubernetes`` uses it. It adds run options (``torchx runopts kubernetes``) for
node selectors, tolerations, secrets, the checkpoint claim, /dev/shm size, image pull secrets,
node shapes, the read-only root file system and the termination grace period, and post-processes
the Volcano Job that TorchX renders: every pod gets the hardened security context and the
/dev/shm sized for its processes of :mod:`components.schedulers.k8s.pod`, and the job the
restart policy of :mod:`components.schedulers.k8s.preemption` (an evicted or failed pod
restarts the whole job, at most ``--max_retries`` times; a replica of a role with TorchX's
REPLICA retry policy, e.g. a ``fault_tolerant`` replica group, restarts alone).
The pod options, their checks and the API server's dry run are shared with
``kubernetes_jobset`` (:mod:`components.schedulers.k8s.base`). Bad options raise
:class:`components.errors.ComponentArgumentError` before anything is submitted; ``torchx run``
prints that one line and exits 1.

``validate_spec=True`` asks the API server for a dry run of the job: TorchX main's option,
which this scheduler also offers on torchx 0.7.0 and turns off by default on both (TorchX main
turns it on, so that ``torchx run --dryrun`` would need a cluster). The server is asked about
the job as submitted, after the pod changes; a refusal or no answer is one line.
"""

from __future__ import annotations

from typing import Any, cast

from torchx.schedulers.api import AppDryRunInfo
from torchx.schedulers.kubernetes_scheduler import (
    LABEL_ROLE_INDEX,
    KubernetesJob,
    KubernetesOpts,
    sanitize_for_serialization,
)
from torchx.specs import AppDef, runopts

from components.schedulers.k8s.base import HardenedKubernetesScheduler
from components.schedulers.k8s.options import (
    check_derived_names,
    check_object_names,
    check_subdomain,
    refuse,
)
from components.schedulers.k8s.pod import customize_pod, pod_options, processes_per_pod
from components.schedulers.k8s.preemption import (
    job_retries,
    restart_policy,
    restarts_alone,
    task_restart_policy,
)
from components.schedulers.torchx_workarounds.releases import replace_cfg

NAME = "kubernetes"


def check_cfg_names(cfg: KubernetesOpts) -> None:
    """Raise unless a queue is given and the queue, namespace and other object names are valid."""
    queue = cfg.get("queue")
    if not queue:
        raise refuse(NAME, "no Volcano queue given; pass -cfg queue=torchx-templates (the queue "
                     "k8s/base creates) or set queue in .torchxconfig's [kubernetes] section")
    check_subdomain(NAME, "queue", queue)
    check_object_names(NAME, cfg)


def check_job_names(job: dict[str, Any]) -> None:
    """Raise unless the rendered job's name and its pods' host names are DNS-1123 labels with
    any id TorchX may append (:func:`components.schedulers.k8s.options.check_derived_names`)."""
    name = job["metadata"]["name"]
    # Volcano names each pod (and, under the svc plugin, its host name) JOB-TASK-INDEX.
    hosts = [("pod hostname", f"{name}-{task['name']}-0") for task in job["spec"]["tasks"]]
    check_derived_names(NAME, name, [("job name", name), *hosts])


class KubernetesScheduler(HardenedKubernetesScheduler):
    """TorchX's kubernetes scheduler plus this repository's pod options and hardening."""

    registered_as = NAME

    def _run_opts(self) -> runopts:
        opts = super()._run_opts()
        # Checked in _submit_dryrun instead, so a missing queue is one line, not a usage dump.
        opts.add("queue", type_=str,
                 help="Volcano queue to schedule the job in (required), e.g. torchx-templates")
        self.add_pod_opts(opts)
        return opts

    def _submit_dryrun(self, app: AppDef, cfg: KubernetesOpts) -> AppDryRunInfo[KubernetesJob]:
        check_cfg_names(cfg)
        pods = pod_options(NAME, cast(dict[str, Any], cfg), app)
        # rendered without TorchX main's validate_spec: the job is validated below, as submitted
        base = super()._submit_dryrun(app, replace_cfg(cfg, validate_spec=False))
        job = cast(dict[str, Any], sanitize_for_serialization(base.request.resource))
        check_job_names(job)
        for task in job["spec"]["tasks"]:
            role = app.roles[int(task["template"]["metadata"]["labels"][LABEL_ROLE_INDEX])]
            task["template"] = customize_pod(task["template"], pods, processes_per_pod(role))
            # TorchX's per-task policies and maxRetry give way to the job's (restart_policy),
            # except for a replica that restarts alone (task_restart_policy)
            task.pop("policies", None)
            task.pop("maxRetry", None)
            if restarts_alone(role):
                task.update(task_restart_policy(role.max_retries))
        job["spec"].update(restart_policy(job_retries(app.roles), sum(
            role.max_retries for role in app.roles if restarts_alone(role))))
        if cfg.get("validate_spec"):
            self.validate_on_server(job, cast(str, cfg.get("namespace") or "default"),
                                    group="batch.volcano.sh", version="v1alpha1", plural="jobs")
        request = KubernetesJob(images_to_push=base.request.images_to_push, resource=job)
        return AppDryRunInfo(request, repr)


def create_scheduler(session_name: str, **kwargs: Any) -> KubernetesScheduler:
    """The entry point TorchX calls (``client``/``docker_client`` pass through, for tests)."""
    return KubernetesScheduler(session_name, client=kwargs.get("client"),
                               docker_client=kwargs.get("docker_client"))

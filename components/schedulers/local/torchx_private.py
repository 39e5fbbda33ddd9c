"""The one module of :mod:`components.schedulers.local` that uses TorchX's private names.

TorchX's local schedulers have no public hook for what this repository's versions extend:

* ``local_cwd`` records the process groups of a job it started, so that ``torchx status`` and
  ``torchx cancel`` from another process find it: TorchX's ``LocalScheduler`` keeps a job's
  processes only in ``_apps`` (app id -> ``_LocalAppDef``, whose ``role_replicas`` hold each
  replica's ``proc``).
* ``local_docker`` checks images through the Docker client TorchX uses
  (``DockerWorkspaceMixin._docker_client``), counts restarts over a job's containers
  (``DockerScheduler._get_containers``), and reads podman's container states as Docker's where
  TorchX's ``describe`` derives each container's state (``DockerScheduler._get_app_state``).

These names have these meanings in torchx 0.7.0 and on TorchX main (torchx-nightly
2026.10.26). The classes here give them public names; the other modules of the package
override only the methods TorchX's Scheduler API defines for implementers (``schedule``, through
:class:`~components.schedulers.submit.SubmitChecks`, ``describe``, ``_validate``,
``_cancel_existing``) and public ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchx.schedulers.docker_scheduler import DockerScheduler
from torchx.schedulers.local_scheduler import LocalScheduler
from torchx.specs import AppState

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container


class TorchXLocalScheduler(LocalScheduler):
    """TorchX's ``LocalScheduler`` with public names for the jobs this object started."""

    def started_here(self, app_id: str) -> bool:
        """Whether this scheduler object started ``app_id`` (and still holds its processes)."""
        return app_id in self._apps

    def process_groups(self, app_id: str) -> list[int]:
        """The process group ids of ``app_id``'s replicas (one a replica: torchrun and its
        workers), of a job :meth:`started_here`."""
        return [replica.proc.pid for replicas in self._apps[app_id].role_replicas.values()
                for replica in replicas]


class TorchXDockerScheduler(DockerScheduler):
    """TorchX's ``DockerScheduler`` with public names for its client, a job's containers and
    the state of one container."""

    def docker_client(self) -> DockerClient:
        """TorchX's Docker client (from the environment, ``DOCKER_HOST``, on first use)."""
        return self._docker_client

    def containers(self, app_id: str) -> list[Container]:
        """Every container of ``app_id``, running or not."""
        return self._get_containers(app_id)

    def container_state(self, container: Container) -> AppState:
        """TorchX's state of one of a job's containers; ``describe`` asks this of each, so a
        subclass extends it."""
        return super()._get_app_state(container)

    def _get_app_state(self, container: Container) -> AppState:
        return self.container_state(container)

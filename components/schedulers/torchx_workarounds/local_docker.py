"""The names of TorchX's ``DockerScheduler`` that ``local_docker`` uses and TorchX keeps private.

:mod:`components.schedulers.local.docker_engine` checks images through the Docker client TorchX uses
(``DockerWorkspaceMixin._docker_client``), counts restarts over a job's containers
(``DockerScheduler._get_containers``), and reads podman's container states as Docker's where
TorchX's ``describe`` derives each container's state (``DockerScheduler._get_app_state``).
These names have these meanings in torchx 0.7.0 and on TorchX main (torchx-nightly
2026.10.26); the class here gives them public names (:mod:`.local` does the same for
``local_cwd``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from docker.errors import APIError
from torchx.schedulers.docker_scheduler import DockerScheduler
from torchx.specs import AppState

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container

# podman's Docker API answers a listing of containers with 500 "read /proc/<pid>/cgroup: no such
# process" when a listed container's process exits while it lists them; a new listing a moment
# later answers. TorchX's describe lists a job's containers, so `torchx status` and `torchx run`'s
# wait would fail with that traceback.
LISTING_ATTEMPTS = 3
LISTING_PAUSE_S = 0.2


class TorchXDockerScheduler(DockerScheduler):
    """TorchX's ``DockerScheduler`` with public names for its client, a job's containers and
    the state of one container."""

    def docker_client(self) -> DockerClient:
        """TorchX's Docker client (from the environment, ``DOCKER_HOST``, on first use)."""
        return self._docker_client

    def containers(self, app_id: str) -> list[Container]:
        """Every container of ``app_id``, running or not."""
        return self._get_containers(app_id)

    def _get_containers(self, app_id: str) -> list[Container]:
        """TorchX's listing of ``app_id``'s containers, listed again (up to
        :data:`LISTING_ATTEMPTS` times) where podman's API fails it because a container's
        process exited meanwhile; any other error is raised at once."""
        for _ in range(LISTING_ATTEMPTS - 1):
            try:
                return super()._get_containers(app_id)
            except APIError as err:
                if "no such process" not in str(err):
                    raise
            time.sleep(LISTING_PAUSE_S)
        return super()._get_containers(app_id)

    def container_state(self, container: Container) -> AppState:
        """TorchX's state of one of a job's containers; ``describe`` asks this of each, so a
        subclass extends it."""
        return super()._get_app_state(container)

    def _get_app_state(self, container: Container) -> AppState:
        return self.container_state(container)

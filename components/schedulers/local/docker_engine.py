"""``local_docker``: TorchX's Docker scheduler, checking its images before anything runs.

The built-in scheduler pulls every image on submit and, when the pull fails, starts containers
from whatever is local, so a job asked for with no image built dies in a docker-py traceback.
This one refuses it up front with one line (:class:`components.errors.ComponentArgumentError`,
printed by ``torchx run`` without a traceback, exit 1): an image reference that is not valid,
no Docker API to talk to, or an image neither present locally nor pullable. Images found
locally are run by their ID, so nothing is pulled for them (a locally built
``torchx-templates:cpu`` would otherwise be looked up on Docker Hub first). It works against
Docker and against podman's Docker-compatible API (``podman system service``; point
``DOCKER_HOST`` at its socket), whose extra container states (e.g. ``stopped``) it reads as
Docker's. ``torchx status`` reports the job's real restart count (TorchX 0.7.0 leaves it at -1).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from torchx.schedulers.api import AppDryRunInfo, DescribeAppResponse
from torchx.schedulers.docker_scheduler import DockerJob
from torchx.specs import AppDef, AppState, Role

from components.containers import reference_error
from components.errors import ComponentArgumentError
from components.schedulers.run_options import StrictRunOptions
from components.schedulers.submit import SubmitChecks
from components.schedulers.torchx_workarounds.local_docker import TorchXDockerScheduler

if TYPE_CHECKING:
    from docker.models.containers import Container


# Container states podman's Docker API reports that Docker's does not (TorchX 0.7.0 knows only
# Docker's and fails with a KeyError on these), as the Docker state they correspond to.
PODMAN_STATES = {"configured": "created", "initialized": "created", "stopping": "running",
                 "stopped": "exited"}


def restart_count(containers: Iterable[Mapping[str, Any]]) -> int:
    """How often a job was restarted, from its containers' inspect attributes: the most any
    replica's container was restarted by its restart policy (``RestartCount``, which Docker and
    podman keep; TorchX's ``--max_retries`` sets ``on-failure`` with that many retries). Each
    replica restarts on its own, so this is the number of attempts the job needed, less one; 0
    when no container restarted."""
    return max((int(attrs.get("RestartCount") or 0) for attrs in containers), default=0)


class DockerScheduler(SubmitChecks, StrictRunOptions, TorchXDockerScheduler):
    """TorchX's ``local_docker`` with the image checks described in the module docstring,
    podman's extra container states understood and restarts counted."""

    registered_as = "local_docker"

    def local_image_id(self, image: str) -> str:
        """The local ID of ``image``, pulling it if it is not local; one-line errors."""
        from docker.errors import DockerException, ImageNotFound

        if image.startswith("sha256:"):
            return image
        error = reference_error(image)
        if error:
            raise ComponentArgumentError(f"local_docker: --image {error}")
        try:
            client = self.docker_client()
            try:
                return client.images.get(image).id
            except ImageNotFound:
                pass
            try:
                return client.images.pull(image).id
            except DockerException as err:
                # the engine's own reason (APIError.explanation), else the first line
                reason = getattr(err, "explanation", None) or str(err).split("\n")[0]
                raise ComponentArgumentError(
                    f"local_docker: image {image} is not built here and cannot be pulled "
                    f"({reason or type(err).__name__}); build it with `images/build cpu` or "
                    "pass --image") from None
        except DockerException as err:
            host = os.environ.get("DOCKER_HOST", "the default socket")
            raise ComponentArgumentError(
                f"local_docker: no Docker API at {host} ({type(err).__name__}); start Docker, "
                "or run .ci/podman-up and export DOCKER_HOST=unix:///run/podman/podman.sock"
            ) from None

    def build_workspace_and_update_role(self, role: Role, workspace: str,
                                        cfg: dict[str, Any]) -> None:
        """Check the base image before TorchX builds a workspace patch on top of it."""
        self.local_image_id(role.image)
        super().build_workspace_and_update_role(role, workspace, cfg)

    def _validate(self, app: AppDef, scheduler: str, *cfg: Any) -> None:
        """Every role's image is valid and present locally (pulled if need be). TorchX main
        passes the run options too; 0.7.0 does not."""
        for role in app.roles:
            self.local_image_id(role.image)
        super()._validate(app, scheduler, *cfg)

    def schedule_checked(self, dryrun_info: AppDryRunInfo[DockerJob]) -> str:
        """Run the containers from local image IDs: TorchX pulls anything else first."""
        job = dryrun_info.request
        job.containers = [replace(c, image=self.local_image_id(c.image)) for c in job.containers]
        return super().schedule_checked(dryrun_info)

    def container_state(self, container: Container) -> AppState:
        """The state of ``container``, reading podman's own states as Docker's."""
        state = container.attrs.get("State")
        status = state.get("Status") if isinstance(state, dict) else state
        if status in PODMAN_STATES:
            if isinstance(state, dict):
                state["Status"] = PODMAN_STATES[status]
            else:
                container.attrs["State"] = PODMAN_STATES[status]
        return super().container_state(container)

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """TorchX's description of the job, with ``num_restarts`` from :func:`restart_count`
        of its containers (TorchX 0.7.0 leaves the default, -1)."""
        response = super().describe(app_id)
        if response is not None:
            response.num_restarts = restart_count(c.attrs for c in self.containers(app_id))
        return response


def create_scheduler(session_name: str, **kwargs: Any) -> DockerScheduler:
    """The ``local_docker`` entry point (pyproject.toml's ``torchx.schedulers`` table)."""
    return DockerScheduler(session_name=session_name)

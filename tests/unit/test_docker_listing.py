"""``local_docker`` lists a job's containers again where podman's Docker API fails the listing
because a container's process exited meanwhile (a 500 "no such process"), and raises any other
error at once (components/schedulers/torchx_workarounds/local_docker.py). TorchX's own listing is
replaced by one that answers as the API did; the real race is in tests/system/test_images.py's
runs."""

from __future__ import annotations

import pytest
from docker.errors import APIError
from torchx.schedulers.docker_scheduler import DockerScheduler as TorchXDocker

from components.schedulers.local.docker_engine import create_scheduler
from components.schedulers.torchx_workarounds import local_docker

RACE = APIError('500 Server Error: Internal Server Error ("read /proc/22344/cgroup: no such '
                'process")')
OTHER = APIError("500 Server Error: Internal Server Error (\"database is locked\")")


@pytest.fixture
def answers(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """What TorchX's listing answers, one item a call (an exception is raised); the calls made
    are counted by what is left."""
    queue: list[object] = []

    def listing(self: TorchXDocker, app_id: str) -> object:
        answer = queue.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(TorchXDocker, "_get_containers", listing)
    monkeypatch.setattr(local_docker, "LISTING_PAUSE_S", 0.0)
    return queue


def test_a_listing_cut_by_an_exiting_container_is_listed_again(answers):
    answers += [RACE, RACE, ["c0", "c1"]]
    assert create_scheduler("t").containers("app") == ["c0", "c1"]
    assert answers == []


def test_the_race_that_persists_and_other_errors_are_raised(answers):
    answers += [RACE, RACE, RACE, ["never"]]
    with pytest.raises(APIError, match="no such process"):
        create_scheduler("t").containers("app")
    assert answers == [["never"]]
    answers[:] = [OTHER, ["never"]]
    with pytest.raises(APIError, match="database is locked"):
        create_scheduler("t").containers("app")
    assert answers == [["never"]]

"""The system tier's shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.ray_cluster import RayCluster, session_cluster


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """The session's Ray cluster (:class:`RayCluster`), up before anything that uses it
    trains."""
    yield from session_cluster()

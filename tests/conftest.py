"""The tiers and the fixtures shared by every tier.

Each test's tier is the folder it lives in, given to it as a marker of that name, so
``pytest tests/unit`` and ``pytest -m "not system"`` select the same tests:
- ``unit``: in this process (no subprocess, no service, no torchrun);
- ``integration``: trainers under torchrun and TorchX's local_cwd in subprocesses;
- ``system``: services started beforehand (the Slurm cluster, podman's containers and pods, a
  Ray cluster, the CRD schemas of Volcano/JobSet/Kueue) and TorchX main.
``tests/support/`` holds the helpers. Under ``CI=true`` a skipped test fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.support.processes import shared_launches
from tests.support.runs import TINY, losses, run_trainer

pytest_plugins = ["pytester", "tests.support.processes", "tests.support.slurm",
                  "tests.support.ci_strict",
                  "tests.support.component_runs", "tests.support.s3"]

TIERS = ("unit", "integration", "system")
TESTS = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, one torch thread per worker (as for every process a test starts,
    tests/support/processes.py): the workers share the cores, and torch's default of a thread
    per core in each, spinning between operations, costs more than it computes."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier, the name of its folder under tests/, and with the service
    it uses: ``slurm`` (the ``slurm_cluster`` fixture, directly or through another) and ``ray``
    (``ray_cluster``, the session's Ray cluster)."""
    for item in items:
        tier = Path(item.fspath).resolve().relative_to(TESTS).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: a test lives in tests/unit, "
                                    "tests/integration or tests/system")
        item.add_marker(tier)
        fixtures = getattr(item, "fixturenames", ())
        for service in ("slurm", "ray"):
            if f"{service}_cluster" in fixtures:
                item.add_marker(service)


@pytest.fixture(scope="session")
def single_process(tmp_path_factory) -> dict[int, float]:
    """Per-step losses of the reference: one process, global batch 16, no accumulation."""
    run_dir = tmp_path_factory.mktemp("single")
    with shared_launches("single_process"):
        run_trainer([*TINY, "--batch-size", "16", "--output-dir", str(run_dir)])
    return losses(run_dir)


@pytest.fixture(scope="session")
def ddp_two_ranks(tmp_path_factory) -> dict[int, float]:
    """Per-step losses of the same run under DDP on 2 ranks (each a batch of 8)."""
    run_dir = tmp_path_factory.mktemp("ddp-two-ranks")
    with shared_launches("ddp_two_ranks"):
        run_trainer([*TINY, "--batch-size", "16", "--output-dir", str(run_dir)], nproc=2)
    return losses(run_dir)


@pytest.fixture(scope="session")
def gpipe_timeline_run(tmp_path_factory) -> Path:
    """The ``single_process`` run as a 2-stage GPipe pipeline of 4 micro-batches on 2 ranks,
    recording its timeline: tests/integration/test_pipeline.py checks its losses and timeline,
    tests/integration/test_plot.py draws it (one launch for both)."""
    run_dir = tmp_path_factory.mktemp("gpipe-timeline")
    with shared_launches("gpipe_timeline_run"):
        run_trainer([*TINY, "--batch-size", "16", "--pp", "2", "--schedule", "gpipe",
                     "--microbatches", "4", "--record-timeline", "--output-dir", str(run_dir)],
                    nproc=2, module="trainers.pipeline")
    return run_dir


@pytest.fixture
def world_of_one():
    """A process group of one in this process (what a trainer run without torchrun forms)."""
    from trainers.config.parsing import parse_config
    from trainers.core.distributed import init_distributed

    with init_distributed(parse_config(["--device", "cpu"], "ddp")) as env:
        yield env

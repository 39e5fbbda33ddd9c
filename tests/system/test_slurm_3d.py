"""The 3-D pipeline component across the two nodes of the local Slurm cluster (.ci/slurm-up):
``torchx run -s slurm components/pipeline.py:pipeline -j 2x4 -- --pp 2 --tp 2`` (dp 2) and
``--pp 2 --tp 4`` (dp 1) train as one process does, and their ranks sit where the (pp, dp, tp)
mesh wants them: every tensor-parallel group on one node, the two pipeline stages on different
nodes.

Where each rank ran is read from what the job records anyway: each node's torchrun logs its
rendezvous result (``global_ranks=[...]``) at ``LOGLEVEL=INFO``, which the component hands on
to torchrun, into its replica's log; and ``torchx status`` (the scheduler's describe) names the
node of each replica. On one node: tests/integration/test_component_3d.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torchx.specs import AppState

from components.schedulers.slurm import create_scheduler
from tests.support.runs import assert_close, losses, run_trainer
from tests.support.slurm import job_dir, run_dir, submit, summary, trainer_args, wait

# name -> (pp, dp, tp) on -j 2x4
LAYOUTS = {"pp2-dp2-tp2": (2, 2, 2), "pp2-dp1-tp4": (2, 1, 4)}
STEPS = 3


def layout_args(pp: int, tp: int) -> list[str]:
    return trainer_args("--pp", str(pp), "--tp", str(tp), steps=STEPS)


@pytest.fixture(scope="module")
def jobs_3d(slurm_cluster, tmp_path_factory) -> tuple[Path, dict[str, str], Path]:
    """Both layouts submitted at once (each takes 2 of a node's 4 CPUs), and the one-process
    run of the same trainer arguments (trainers.ddp) here."""
    cwd = tmp_path_factory.mktemp("slurm-3d")
    handles = {name: submit(cwd, "pipeline", "2x4", layout_args(pp, tp), "--env", "LOGLEVEL=INFO")
               for name, (pp, _, tp) in LAYOUTS.items()}
    reference = cwd / "one-process"
    run_trainer([*trainer_args(steps=STEPS), "--output-dir", str(reference)])
    for handle in handles.values():
        wait(handle)
    return cwd, handles, reference


def node_of_each_rank(cwd: Path, handle: str) -> dict[int, str]:
    """{global rank: node}: replica k's torchrun logged its ranks in slurm-<id>-pipeline-k.err,
    and the scheduler reports replica k's node."""
    app_id = handle.rsplit("/", 1)[-1]
    desc = create_scheduler("test").describe(app_id)
    assert desc is not None, handle
    (role,) = desc.roles_statuses
    out = {}
    for replica in role.replicas:
        log = (job_dir(cwd, handle) / f"slurm-{app_id}-pipeline-{replica.id}.err").read_text()
        (ranks,) = re.findall(r"global_ranks=\[([\d, ]+)\]", log)
        out |= {int(rank): replica.hostname for rank in ranks.split(",")}
    return out


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_3d_pipeline_on_two_slurm_nodes_trains_as_one_process(jobs_3d, layout):
    cwd, handles, reference = jobs_3d
    handle = handles[layout]
    assert wait(handle) == AppState.SUCCEEDED
    assert (summary(cwd, handle)["world_size"], summary(cwd, handle)["steps"]) == (8, STEPS)
    assert_close(losses(run_dir(cwd, handle)), losses(reference))


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_3d_pipeline_keeps_tp_groups_inside_a_node_and_stages_on_different_nodes(jobs_3d,
                                                                                 layout):
    """The mesh lays the ranks out as init_device_mesh does (trainers/pipeline.py): row-major
    over (pp, dp, tp), so the tp groups are runs of --tp consecutive ranks and stage p is the
    p-th run of dp x tp ranks."""
    cwd, handles, _ = jobs_3d
    pp, dp, tp = LAYOUTS[layout]
    node = node_of_each_rank(cwd, handles[layout])
    assert sorted(node) == list(range(8)) and len(set(node.values())) == 2, node
    mesh = torch.arange(pp * dp * tp).reshape(pp, dp, tp)
    for group in mesh.reshape(-1, tp).tolist():
        assert len({node[rank] for rank in group}) == 1, (group, node)
    stage_nodes = [{node[rank] for rank in mesh[stage].flatten().tolist()} for stage in range(pp)]
    assert all(len(nodes) == 1 for nodes in stage_nodes), (stage_nodes, node)
    assert len(set.union(*stage_nodes)) == pp, (stage_nodes, node)

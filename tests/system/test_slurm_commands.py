"""The Slurm commands that README and the planner print, dry-run against the local Slurm
cluster (their Kubernetes twins need no cluster: tests/integration)."""

from __future__ import annotations

from tests.integration.test_plan import assert_planner_commands_accepted
from tests.integration.test_scheduler_table import assert_readme_command_accepted
from tests.integration.test_tune_component import assert_slurm_runs_the_search_as_one_step


def test_every_command_the_planner_prints_is_accepted_on_slurm(slurm_cluster):
    assert_planner_commands_accepted("slurm")


def test_readme_gpu_cluster_command_is_accepted_on_slurm(slurm_cluster):
    assert_readme_command_accepted("slurm")


def test_the_tune_component_runs_the_search_as_one_srun(slurm_cluster):
    assert_slurm_runs_the_search_as_one_step()

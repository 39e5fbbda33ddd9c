"""The ``tune`` component (components/tune.py): one job running ``python -m trainers.tune`` on
one node's local Ray cluster, its search checked before anything is scheduled, the same AppDef
on every scheduler. Its run under ``torchx run -s local_cwd`` is in tests/system/test_tune.py
(it needs Ray), its Slurm dry run in tests/system/test_slurm_commands.py (it needs the
controller)."""

from __future__ import annotations

import pytest

from components.errors import ComponentArgumentError
from components.tune import tune
from tests.support.runs import torchx_cli

TRIAL = ["--model", "tiny", "--steps", "20", "--eval-every", "5"]


def test_the_job_runs_the_search_on_the_nodes_cpus():
    app = tune(*TRIAL, "--output-dir", "/mnt/s", trainer="fsdp", workers=2, trials=6,
               search="lr=loguniform:1e-4:1e-2 batch-size=choice:8,16", cpu=8, seed=3)
    (role,) = app.roles
    assert (role.entrypoint, role.num_replicas, role.resource.cpu) == ("python", 1, 8)
    assert role.args == ["-m", "trainers.tune", "--trainer", "fsdp", "--workers", "2",
                         "--trials", "6", "--max-concurrent", "0", "--num-cpus", "8",
                         "--search", "lr=loguniform:1e-4:1e-2", "--search",
                         "batch-size=choice:8,16", "--seed", "3", "--", *TRIAL,
                         "--output-dir", "/mnt/s"]
    gpu_role = tune(*TRIAL, trainer="ddp", search="lr=choice:1e-3", gpu=4).roles[0]
    assert gpu_role.args[-2:] == ["--output-dir", "outputs/${app_id}"]
    assert "--gpus-per-worker" in gpu_role.args and gpu_role.resource.gpu == 4


@pytest.mark.parametrize("kwargs, message", [
    ({"trainer": "ddp", "search": "lr=loguniform:0:1"}, "loguniform needs 0 < LO"),
    ({"trainer": "ddp", "search": "lrr=choice:1,2"}, "python -m trainers.ddp has no --lrr"),
    ({"trainer": "model_parallel", "search": "lr=choice:1e-3"}, "cannot run under Ray Train"),
    ({"trainer": "ddp", "search": "lr=choice:1e-3", "workers": 4},
     "--workers 4 per trial, but the node has 2 CPUs; pass --workers 2 or fewer"),
    ({"trainer": "ddp", "search": ""}, "nothing to search; pass --search"),
])
def test_a_bad_search_is_refused_before_scheduling(kwargs, message):
    with pytest.raises(ComponentArgumentError) as err:
        tune(*TRIAL, **kwargs)
    assert str(err.value).startswith("trainers.tune: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def assert_slurm_runs_the_search_as_one_step() -> None:
    """The Slurm dry run: one srun of the search command, as the node's job (the Slurm
    scheduler checks the partition with the controller first: tests/system/test_slurm_commands.py
    runs it against the local cluster)."""
    proc = torchx_cli("run", "-s", "slurm", "--dryrun", "tune", "--trainer", "ddp", "--search",
                      "lr=loguniform:1e-4:1e-2", "--", *TRIAL, "--output-dir", "/mnt/s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (srun,) = [line for line in proc.stdout.splitlines() if line.startswith("srun ")]
    assert srun.endswith("python -m trainers.tune --trainer ddp --workers 1 --trials 4 "
                         "--max-concurrent 0 --num-cpus 2 --search lr=loguniform:1e-4:1e-2 -- "
                         "--model tiny --steps 20 --eval-every 5 --output-dir /mnt/s"), srun

"""Every component on a real Slurm cluster through ``torchx run -s slurm`` (our extended
scheduler, components/schedulers/slurm.py): on one node and across two, status, logs,
cancel, a failing job, requeue with resume, and the bad options refused before submission.

The cluster is the one ``.ci/slurm-up`` starts (partition ``debug``, nodes tt-node1 and
tt-node2). Without it the cluster tests skip (in CI a skip fails); the option parsing and
rendering tests run anywhere.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from torchx.specs import AppState

from components.schedulers.slurm import slurm_state, slurm_user, time_limit_seconds
from tests.conftest import REPO
from tests.slurm_support import (
    TERMINAL,
    job_dir,
    run_dir,
    status,
    submit,
    summary,
    torchx,
    trainer_args,
    wait,
)
from tests.test_faults import assert_same_run

# (component, -j, trainer arguments): each on one node and across the two nodes. The model
# parallel trainer drives all of a node's devices from one process, so on one node it is 1x1.
CASES = [
    ("ddp", "1x2", []), ("ddp", "2x1", []),
    ("fsdp", "1x2", []), ("fsdp", "2x1", ["--reshard-after-forward", "false"]),
    ("tensor_parallel", "1x2", ["--tp", "2"]), ("tensor_parallel", "2x1", ["--tp", "2"]),
    ("pipeline", "1x2", ["--pp", "2"]), ("pipeline", "2x1", ["--pp", "2", "--schedule", "1f1b"]),
    ("model_parallel", "1x1", ["--devices", "cpu,cpu"]),
    ("model_parallel", "2x1", ["--devices", "cpu,cpu"]),
]


@pytest.fixture(scope="module")
def component_jobs(slurm_cluster, tmp_path_factory) -> tuple[Path, dict[tuple[str, str], str]]:
    """Every case of CASES submitted at once (the cluster queues what does not fit)."""
    cwd = tmp_path_factory.mktemp("slurm")
    handles = {(c, j): submit(cwd, c, j, trainer_args(*extra)) for c, j, extra in CASES}
    for handle in handles.values():
        wait(handle)
    return cwd, handles


@pytest.mark.slow
@pytest.mark.parametrize("component, j", [(c, j) for c, j, _ in CASES])
def test_component_on_slurm(component_jobs, component, j):
    cwd, handles = component_jobs
    handle = handles[component, j]
    assert "State: SUCCEEDED" in status(cwd, handle)
    result = summary(cwd, handle)
    nodes, nproc = (int(n) for n in j.split("x"))
    assert result["world_size"] == nodes * nproc
    assert result["first_loss"] > math.log(256) - 0.2
    assert result["final_loss"] < result["first_loss"] - 0.8
    log = torchx("log", "--streams", "stdout", f"{handle}/{component}", cwd=cwd).stdout
    assert "summary: model=tiny" in log and "step 30/30" in log


@pytest.mark.slow
@pytest.mark.torchx_main
def test_cancelled_job_reports_cancelled(slurm_cluster, tmp_path):
    """With the repository's .torchxconfig slurm profile (partition, time, job_dir)."""
    profile = {"TORCHXCONFIG": str(REPO / ".torchxconfig")}
    proc = torchx("run", "-s", "slurm", "--workspace", f"file://{REPO}",
                  str(REPO / "components" / "ddp.py") + ":ddp", "-j", "1x2", "--",
                  *trainer_args(steps=100000), cwd=tmp_path, env=profile)
    handle = proc.stdout.strip().splitlines()[-1]
    assert handle.startswith("slurm://"), proc.stdout
    assert job_dir(tmp_path, handle).parent == tmp_path / "slurm-jobs"
    wait(handle, {AppState.RUNNING})
    torchx("cancel", handle, cwd=tmp_path)
    assert wait(handle, TERMINAL, timeout=60) == AppState.CANCELLED
    assert "State: CANCELLED" in status(tmp_path, handle)
    listed = torchx("list", "-s", "slurm", cwd=tmp_path).stdout
    assert re.search(rf"{re.escape(handle.rsplit('/', 1)[-1])}\s.*CANCELLED", listed), listed


@pytest.mark.slow
@pytest.mark.torchx_main
def test_failing_job_reports_failed_and_its_log_names_the_error(slurm_cluster, tmp_path):
    handle = submit(tmp_path, "ddp", "1x2", trainer_args("--data", str(tmp_path / "missing.bin")),
                    "--check_paths", "false")
    assert wait(handle) == AppState.FAILED
    assert "State: FAILED" in status(tmp_path, handle)
    log = torchx("log", f"{handle}/ddp", cwd=tmp_path, check=False)
    assert f"--data {tmp_path / 'missing.bin'}" in log.stdout + log.stderr


@pytest.mark.slow
def test_requeued_job_resumes_from_its_checkpoint(slurm_cluster, tmp_path):
    """Node 2 is lost after step 6 (rank 1 and its torchrun agent killed, so torchrun cannot
    restart it in place); Slurm requeues the job, which resumes at step 4."""
    args = trainer_args("--checkpoint-every", "4", steps=10)
    reference = submit(tmp_path, "ddp", "2x1", args)
    handle = submit(tmp_path, "ddp", "2x1", args, "--max_retries", "1",
                    "--env", "TRAINERS_KILL_AT=1:6:node")
    assert wait(handle) == AppState.SUCCEEDED and wait(reference) == AppState.SUCCEEDED
    text = status(tmp_path, handle)
    assert "State: SUCCEEDED" in text and "Num Restarts: 1" in text
    result = summary(tmp_path, handle)
    assert (result["resumed_from_step"], result["steps"]) == (4, 10)
    assert (result["restarts"], result["steps_lost"]) == (1, 2)
    assert (run_dir(tmp_path, handle) / "fault-injected-rank1-step6").exists()
    assert_same_run(run_dir(tmp_path, handle), run_dir(tmp_path, reference), tmp_path)


BAD_OPTIONS = [
    ("partition=gpu-a100", "ddp", "1x2",
     "slurm: partition=gpu-a100 does not exist; pass -cfg partition=<one of debug>"),
    ("time=3:00:00", "ddp", "1x2",
     "slurm: time=3:00:00 exceeds partition debug's limit 02:00:00; "
     "pass -cfg time=<at most 02:00:00>"),
    ("", "ddp", "3x1",
     "slurm: the job needs 3 nodes (one per replica) but partition debug has 2; lower the "
     "nodes in -j (e.g. -j 2xN) or pick a bigger partition"),
    ("account=sales", "ddp", "1x2",
     f"slurm: account=sales is not one of user {slurm_user()}'s accounts; "
     "pass -cfg account=<one of research, root>"),
    ("qos=urgent", "ddp", "1x2",
     f"slurm: qos=urgent is not allowed for user {slurm_user()}; "
     "pass -cfg qos=<one of low, normal>"),
]
BAD_OPTIONS_ANYWHERE = [
    ("time=1h", "ddp", "1x2",
     "slurm: time=1h is not a Slurm time limit; use minutes (30), HH:MM:SS (2:00:00) or "
     "D-HH:MM:SS (1-12:00:00)"),
    ("job_dir=/proc/jobs", "ddp", "1x2",
     "slurm: job_dir=/proc/jobs cannot be written (/proc: No such file or directory); "
     "pass -cfg job_dir=<a directory you can write>"),
]


def _refused(tmp_path: Path, cfg: str, component: str, j: str, message: str) -> None:
    defaults = {"partition": "debug", "job_dir": str(tmp_path / "jobs")}
    overrides = dict(kv.split("=", 1) for kv in filter(None, cfg.split(",")))
    proc = torchx("run", "-s", "slurm", "--workspace", f"file://{REPO}", "-cfg",
                  ",".join(f"{k}={v}" for k, v in {**defaults, **overrides}.items()),
                  str(REPO / "components" / f"{component}.py") + f":{component}", "-j", j,
                  "--", *trainer_args(batch_size=48), cwd=tmp_path, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert message in proc.stderr.splitlines(), proc.stderr
    assert "Traceback" not in proc.stderr and "slurm://" not in proc.stdout
    assert not (tmp_path / ".torchxslurmjobdirs").exists()
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


@pytest.mark.parametrize("cfg, component, j, message", BAD_OPTIONS)
def test_bad_option_refused_before_submission(slurm_cluster, tmp_path, cfg, component, j,
                                              message):
    _refused(tmp_path, cfg, component, j, " " + message)


@pytest.mark.parametrize("cfg, component, j, message", BAD_OPTIONS_ANYWHERE)
def test_bad_option_refused_without_a_cluster(tmp_path, cfg, component, j, message):
    _refused(tmp_path, cfg, component, j, " " + message)


def test_sbatch_script_carries_account_qos_exclusive_and_container(slurm_cluster, tmp_path):
    """A dry run with ``partition=`` asks the controller whether the partition exists, so this
    needs the local cluster (skipped on a laptop without it, failed in CI)."""
    proc = torchx("run", "--dryrun", "-s", "slurm", "--workspace", "", "-cfg",
                  "partition=debug,time=1:00:00,account=research,qos=low,exclusive=True,"
                  "container_image=nvcr.io#nvidia/pytorch:24.05-py3,"
                  "container_mounts=/data:/data",
                  str(REPO / "components" / "ddp.py") + ":ddp", "-j", "2x1", "--", *trainer_args(),
                  cwd=tmp_path)
    script = proc.stdout.split("=== SCHEDULER REQUEST ===", 1)[1]
    sbatch = script.strip().splitlines()[0].split()  # sbatch ... $SBATCH_SCRIPT
    groups = [line for line in script.splitlines() if line.startswith("#SBATCH --job-name")]
    assert len(groups) == 2  # one heterogeneous component per node
    for group in groups:
        for flag in ("--qos=low", "--exclusive", "--partition=debug", "--time=1:00:00",
                     "--requeue"):
            assert flag in group.split(), (flag, group)
        # the account once: on each component (ours, on 0.7.0), or on sbatch's command line
        # (TorchX main's option; Slurm charges every component to it)
        assert ("--account=research" in group.split()) != ("--account=research" in sbatch)
    assert script.count("--container-image=nvcr.io#nvidia/pytorch:24.05-py3") == 2
    assert script.count("--container-mounts=/data:/data") == 2


@pytest.mark.parametrize("value, seconds", [
    ("30", 1800), ("30:15", 1815), ("2:00:00", 7200), ("1-12", 129600),
    ("1-0:30", 88200), ("2-01:02:03", 176523), ("UNLIMITED", math.inf),
])
def test_time_limit_formats(value, seconds):
    assert time_limit_seconds(value) == seconds


@pytest.mark.parametrize("value", ["1h", "", "1:2:3:4", "-5", "1-", "90m"])
def test_time_limit_rejects(value):
    with pytest.raises(ValueError):
        time_limit_seconds(value)


@pytest.mark.parametrize("state, expected", [
    ("CANCELLED by 0", AppState.CANCELLED), ("CANCELLED", AppState.CANCELLED),
    (["RUNNING"], AppState.RUNNING), ("COMPLETED", AppState.SUCCEEDED),
    ("REQUEUED", AppState.PENDING), ("OUT_OF_MEMORY", AppState.FAILED),
    ("SOMETHING_NEW", AppState.UNKNOWN),
])
def test_slurm_states(state, expected):
    assert slurm_state(state) == expected

"""The Slurm scheduler's own logic in this process: time limits, Slurm states, a job described
from accounting and one that accounting does not know yet (described from squeue), the job
script, where ``torchx log`` reads, and what a job directory's snapshot of the workspace holds.
The jobs on a real cluster are tests/system/test_slurm.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from torchx.schedulers.api import DescribeAppResponse, Stream
from torchx.schedulers.slurm_scheduler import SlurmBatchRequest, SlurmReplicaRequest
from torchx.specs import AppState, macros

from components.errors import ComponentArgumentError
from components.schedulers.slurm import create_scheduler
from components.schedulers.slurm.job_dir import snapshot_workspace
from components.schedulers.slurm.options import time_limit_seconds
from components.schedulers.slurm.script import JobRequest
from components.schedulers.slurm.states import slurm_state
from tests.support.runs import REPO


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
    ("CONFIGURING", AppState.PENDING), ("COMPLETING", AppState.RUNNING),
    ("SOMETHING_NEW", AppState.UNKNOWN),
])
def test_slurm_states(state, expected):
    assert slurm_state(state) == expected


# -- status from accounting: each component at its latest attempt -----------------------------

def _record(offset: int, submitted: int, state: str, code: int = 0) -> dict:
    """A ``sacct --json`` record of component ``offset`` of heterogeneous job 300 (Slurm
    >= 23.02's shapes: state lists, ``{"set", "number"}`` integers)."""
    return {"job_id": 300 + offset, "het": {"job_id": 300, "job_offset": offset},
            "name": f"ddp-{offset}", "state": {"current": [state]}, "nodes": f"tt-node{offset + 1}",
            "time": {"submission": {"set": True, "number": submitted}},
            "exit_code": {"return_code": {"set": True, "number": code}}}


def test_job_described_from_accounting_at_its_latest_attempt(monkeypatch):
    """A job requeued once: the first attempt failed on both components; in the second, one
    component failed and the other was cancelled, which reads as FAILED."""
    records = [_record(0, 1, "FAILED", 1), _record(1, 1, "FAILED", 1),
               _record(0, 2, "FAILED", 1), _record(1, 2, "CANCELLED")]
    scheduler = create_scheduler("test")
    monkeypatch.setattr(scheduler, "_sacct_jobs", lambda *args: records)
    desc = scheduler.describe("300")
    assert desc is not None and desc.state == AppState.FAILED and desc.num_restarts == 1
    assert desc.msg == "ddp-0: FAILED (exit 1); ddp-1: CANCELLED"
    assert [(r.id, r.state, r.hostname) for r in desc.roles_statuses[0].replicas] == [
        (0, AppState.FAILED, "tt-node1"), (1, AppState.CANCELLED, "tt-node2")]
    assert [(app.app_id, app.state) for app in scheduler.list()] == [("300", AppState.FAILED)]


# -- status right after submission: squeue when accounting does not know the job yet --------

# Recorded on the local cluster (Slurm 22.05.8): `squeue -h -j ID -o '%i|%j|%T|%N'` right after
# sbatch of a two-node (heterogeneous) and a one-node job, and two seconds later.
SQUEUE_TWO_NODES_PENDING = "201+0|ddp-0|PENDING|\n201+1|ddp-1|PENDING|\n"
SQUEUE_TWO_NODES_RUNNING = "201+0|ddp-0|RUNNING|tt-node1\n201+1|ddp-1|RUNNING|tt-node2\n"
SQUEUE_ONE_NODE_PENDING = "203|ddp-0|PENDING|\n"


@pytest.mark.parametrize("app_id, squeue, state, hosts", [
    ("201", SQUEUE_TWO_NODES_PENDING, AppState.PENDING, ["", ""]),
    ("201", SQUEUE_TWO_NODES_RUNNING, AppState.RUNNING, ["tt-node1", "tt-node2"]),
    ("203", SQUEUE_ONE_NODE_PENDING, AppState.PENDING, [""]),
    ("203", "203|ddp-0|CONFIGURING|tt-node1\n", AppState.PENDING, ["tt-node1"]),
])
def test_job_unknown_to_accounting_is_described_from_squeue(monkeypatch, app_id, squeue, state,
                                                            hosts):
    scheduler = create_scheduler("test")
    monkeypatch.setattr(scheduler, "_sacct_jobs", lambda *args: [])
    monkeypatch.setattr(scheduler, "_squeue", lambda job: squeue)
    desc = scheduler.describe(app_id)
    assert desc is not None and desc.state == state
    assert [r.name for r in desc.roles] == ["ddp"] and desc.roles[0].num_replicas == len(hosts)
    replicas = desc.roles_statuses[0].replicas
    assert [(r.id, r.state, r.hostname) for r in replicas] == [
        (i, state, host) for i, host in enumerate(hosts)]


@pytest.mark.parametrize("squeue", ["", "999|ddp-0|PENDING|\n"])
def test_job_unknown_everywhere_does_not_exist(monkeypatch, squeue):
    scheduler = create_scheduler("test")
    monkeypatch.setattr(scheduler, "_sacct_jobs", lambda *args: [])
    monkeypatch.setattr(scheduler, "_squeue", lambda job: squeue)
    assert scheduler.describe("201") is None


# -- the job script -------------------------------------------------------------------------

def _job(signal_grace: int | None = None) -> JobRequest:
    """A two-node job's request as TorchX's dry run makes it (the fields of its dataclasses)."""
    replicas = {name: SlurmReplicaRequest(
        name=name, entrypoint="bash", args=["-c", "echo $HOSTNAME"],
        srun_opts={"output": f"slurm-{macros.app_id}-{name}.out", "wait": "60"},
        sbatch_opts={"requeue": None, "ntasks-per-node": "1"}, env={"A": "1"})
        for name in ("ddp-0", "ddp-1")}
    return JobRequest(cmd=["sbatch", "--parsable"], replicas=replicas, job_dir=None,
                      max_retries=1, signal_grace=signal_grace)


def test_job_script_is_torchx_script_with_attempt_lines():
    """Without ``signal_grace`` the script is TorchX's own for the same request, plus the lines
    that mark each attempt in every replica's logs."""
    job = _job()
    lines = job.materialize().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith('attempt="==== torchx: job'))
    assert lines[at + 1] == ('for log in "slurm-$SLURM_JOB_ID-"ddp-0.out "slurm-$SLURM_JOB_ID-"'
                             'ddp-0.err "slurm-$SLURM_JOB_ID-"ddp-1.out "slurm-$SLURM_JOB_ID-"'
                             'ddp-1.err; do echo "$attempt" >>"$log"; done\n')
    assert lines[at + 2] == "\n" and lines[at + 3] == "set +e\n"
    torchx_script = SlurmBatchRequest(cmd=job.cmd, replicas=job.replicas, job_dir=None,
                                      max_retries=1).materialize()
    assert "".join(lines[:at] + lines[at + 3:]) == torchx_script


def test_job_script_with_signal_grace_forwards_and_requeues():
    """With ``signal_grace`` srun runs in the background under the traps, and a signalled job
    that did not finish requeues itself before TorchX's own retries are considered."""
    script = _job(signal_grace=120).materialize()
    order = ["for log in", "trap forward USR1", "set +e\nsrun ", ' &\nsrun_pid=$!',
             'wait "$srun_pid"\nexitcode=$?\nset -e\n', 'if [ -n "$preempted" ] && ',
             'echo "job exited with code $exitcode"']
    positions = [script.index(mark) for mark in order]
    assert positions == sorted(positions)
    assert script.count("scontrol requeue") == 2


# -- torchx log: stdout by default ------------------------------------------------------------

@pytest.fixture
def finished_job_logs(tmp_path, monkeypatch):
    """A finished job 7 with one replica, its logs in a job directory recorded in
    .torchxslurmjobdirs of the submitting directory (the cwd)."""
    jobs = tmp_path / "jobs" / "ddp-1"
    jobs.mkdir(parents=True)
    (jobs / "slurm-7-ddp-0.out").write_text("step 1/2 | loss 5.5\nsummary: model=tiny\n")
    (jobs / "slurm-7-ddp-0.err").write_text("W1201 gloo warning\n")
    submitted = tmp_path / "submitted"
    submitted.mkdir()
    (submitted / ".torchxslurmjobdirs").write_text(f"7 = {jobs}\n")
    monkeypatch.chdir(submitted)
    scheduler = create_scheduler("test")
    monkeypatch.setattr(scheduler, "describe", lambda app_id: DescribeAppResponse(
        app_id=app_id, state=AppState.SUCCEEDED))
    return scheduler


@pytest.mark.parametrize("streams, expected", [
    (None, ["step 1/2 | loss 5.5\n", "summary: model=tiny\n"]),
    (Stream.STDOUT, ["step 1/2 | loss 5.5\n", "summary: model=tiny\n"]),
    (Stream.STDERR, ["W1201 gloo warning\n"]),
    (Stream.COMBINED, ["step 1/2 | loss 5.5\n", "summary: model=tiny\n", "W1201 gloo warning\n"]),
])
def test_log_reads_stdout_unless_asked(finished_job_logs, streams, expected):
    assert list(finished_job_logs.log_iter("7", "ddp", 0, streams=streams)) == expected


def test_log_of_a_replica_that_wrote_nothing_says_why(finished_job_logs):
    with pytest.raises(ComponentArgumentError, match=r"^slurm: job 7 wrote no .*/jobs/ddp-1/"
                       r"slurm-7-ddp-1\.out: it ended before that replica started"):
        list(finished_job_logs.log_iter("7", "ddp", 1))


def test_log_from_another_directory_names_the_fix(finished_job_logs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ComponentArgumentError, match=r"run torchx log from the directory you "
                       r"submitted the job from$"):
        list(finished_job_logs.log_iter("7", "ddp", 0))


# -- what a job directory gets: the sources -----------------------------------------------------

def _workspace(root: Path, files: list[str]) -> Path:
    """A workspace with the repository's .torchxignore and ``files``; the .py files are
    executable, to check that modes survive."""
    root.mkdir()
    (root / ".torchxignore").write_text((REPO / ".torchxignore").read_text())
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)
        if name.endswith(".py"):
            path.chmod(0o755)
    return root


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_snapshot_copies_sources_only(tmp_path):
    """The repository's .torchxignore drops virtualenvs, outputs, the default job parent and
    git; the scheduler drops the jobs' own parent even when no ignore names it (job_dir=jobs)."""
    sources = ["train.py", "pkg/model.py", "docs/notes.md"]
    workspace = _workspace(tmp_path / "ws", sources + [
        ".venv/lib/torch.so", ".venv-ray/lib/ray.so", "outputs/123/checkpoint.pt",
        "slurm-jobs/ddp-1/train.py", "jobs/ddp-2/train.py", ".git/HEAD",
        "pkg/__pycache__/model.cpython-311.pyc", ".torchxslurmjobdirs"])
    target = tmp_path / "job"
    target.mkdir()
    snapshot_workspace(f"file://{workspace}", str(target), skip=[str(workspace / "jobs")])
    assert _tree(target) == {".torchxignore", *sources}
    assert (target / "train.py").stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize("not_source", [
    "images/wheels/torch-2.13.0-cp311-cp311-linux_x86_64.whl",  # what images/build downloads
    ".pytest_cache/v/cache/nodeids", ".ruff_cache/0.9.0/123456",
])
def test_snapshot_leaves_out_what_is_not_source(tmp_path, not_source):
    workspace = _workspace(tmp_path / "ws", ["train.py", not_source])
    target = tmp_path / "job"
    target.mkdir()
    snapshot_workspace(f"file://{workspace}", str(target))
    assert _tree(target) == {".torchxignore", "train.py"}

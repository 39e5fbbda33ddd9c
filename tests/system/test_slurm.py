"""Every component on a real Slurm cluster through ``torchx run -s slurm`` (our extended
scheduler, components/schedulers/slurm/): on one node and across two, status, logs,
cancel, a failing job, requeue with resume, preemption and time limits (``signal_grace``), and
the bad options refused before submission.

The cluster is the one ``.ci/slurm-up`` starts (partition ``debug``, nodes tt-node1 and
tt-node2). Without it the cluster tests skip (in CI a skip fails). The scheduler's in-process
logic (time limits, states, logs, snapshots) is tests/unit/test_slurm_scheduler.py.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from torchx.specs import AppState

from components.schedulers.slurm import create_scheduler
from components.schedulers.slurm.preflight import slurm_user
from tests.support.runs import REPO, assert_same_run
from tests.support.slurm import (
    TERMINAL,
    attempts_of,
    job_dir,
    restart_waits,
    run_dir,
    status,
    submit,
    summary,
    torchx,
    trainer_args,
    wait,
)

# (component, -j, trainer arguments): every component across the two nodes, and the two
# launch shapes of one node (torchrun with 2 processes; the model parallel trainer, which
# drives all of a node's devices from one process, 1x1) on one node. Tensor parallel across
# two one-process nodes is the layout the placement rule refuses, so that case also proves
# its escape, --allow-cross-node-tp, on a real scheduler.
CASES = [
    ("ddp", "1x2", []), ("ddp", "2x1", []),
    ("fsdp", "2x1", ["--reshard-after-forward", "false"]),
    ("tensor_parallel", "2x1", ["--tp", "2", "--allow-cross-node-tp"]),
    ("pipeline", "2x1", ["--pp", "2", "--schedule", "1f1b"]),
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
    log = torchx("log", f"{handle}/{component}", cwd=cwd).stdout  # stdout by default
    assert "summary: model=tiny" in log and "step 30/30" in log


@pytest.mark.slow
def test_jobs_submitted_together_share_the_nodes_in_their_own_directories(component_jobs):
    """Every case was submitted at once, five two-node jobs among them: each job has its own
    handle, job directory and run (test_component_on_slurm checks each run's numbers)."""
    cwd, handles = component_jobs
    assert len(set(handles.values())) == len(CASES)
    dirs = [run_dir(cwd, handle) for handle in handles.values()]
    assert len({d.parent.parent for d in dirs}) == len(CASES)  # distinct job directories
    for run in dirs:
        assert (run / "checkpoints" / "step_00000030" / "manifest.json").is_file(), run


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
    # `torchx list` reads accounting, which slurmctld updates asynchronously (seconds behind
    # under load).
    pattern = rf"{re.escape(handle.rsplit('/', 1)[-1])}\s.*CANCELLED"
    deadline = time.monotonic() + 60
    while not re.search(pattern, listed := torchx("list", "-s", "slurm", cwd=tmp_path).stdout):
        assert time.monotonic() < deadline, listed
        time.sleep(2)


@pytest.mark.slow
@pytest.mark.torchx_main
def test_failing_job_reports_failed_and_its_log_names_the_error(slurm_cluster, tmp_path):
    handle = submit(tmp_path, "ddp", "1x2", trainer_args("--data", str(tmp_path / "missing.bin")),
                    "--check_paths", "false")
    assert wait(handle) == AppState.FAILED
    assert "State: FAILED" in status(tmp_path, handle)
    log = torchx("log", "--streams", "stderr", f"{handle}/ddp", cwd=tmp_path, check=False)
    assert f"--data {tmp_path / 'missing.bin'}" in log.stdout


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
    # Both attempts' lines, each after its own attempt line (the logs are appended to). Rank 0,
    # which prints, may run on either node in either attempt: read both replicas' logs.
    logs = [attempts_of(torchx("log", f"{handle}/ddp/{k}", cwd=tmp_path).stdout) for k in (0, 1)]
    assert [sorted(log) for log in logs] == [[1, 2], [1, 2]], logs
    attempts = {n: [line for log in logs for line in log[n]] for n in (1, 2)}
    assert any(re.search(r"step +\d+/10", line) for line in attempts[1]), attempts[1]
    assert any("resumed from" in line and "at step 4" in line for line in attempts[2])
    assert any(re.search(r"step +10/10", line) for line in attempts[2]), attempts[2]
    # Two nodes: a heterogeneous job, which only the backfill scheduler starts (.ci/slurm-up).
    assert all(w <= 30 for w in restart_waits(handle)), restart_waits(handle)


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
    ("constraint=nosuchfeature", "ddp", "1x2",  # refused by sbatch itself
     "slurm: sbatch refused the job (sbatch: error: Batch job submission failed: Invalid "
     "feature specification); use -cfg options and -j/--gpu/--memMB sizes this cluster "
     "accepts (torchx runopts slurm lists the options, sinfo -N -l the nodes)"),
]
# Without -cfg time (tests/integration/test_bad_input_matrix.py gives every Slurm row time=15).
BAD_OPTIONS_WITHOUT_TIME = [
    ("signal_grace=7200", "ddp", "1x2",
     "slurm: signal_grace=7200 is not below the job's time limit (partition debug's MaxTime "
     "02:00:00, as no -cfg time is given, 7200 s) less the 60 s by which Slurm may signal "
     "early; pass -cfg signal_grace=<at most 7139> or a longer -cfg time"),
]
BAD_OPTIONS_ANYWHERE = [
    ("time=1h", "ddp", "1x2",
     "slurm: time=1h is not a Slurm time limit; use minutes (30), HH:MM:SS (2:00:00) or "
     "D-HH:MM:SS (1-12:00:00)"),
    ("job_dir=/proc/jobs", "ddp", "1x2",
     "slurm: job_dir=/proc/jobs cannot be written (/proc: a proc file system); "
     "pass -cfg job_dir=<a directory you can write>"),
    ("time=2,signal_grace=60", "ddp", "1x2",
     "slurm: signal_grace=60 is not below the job's time limit (time=2, 120 s) less the 60 s "
     "by which Slurm may signal early; pass -cfg signal_grace=<at most 59> or a longer "
     "-cfg time"),
    ("signal_grace=0", "ddp", "1x2",
     "slurm: signal_grace=0 is not between 1 and 65535 seconds (sbatch --signal's range); "
     "pass e.g. signal_grace=300"),
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
    assert not (tmp_path / "jobs").exists()  # not even the parent of the job's directory


@pytest.mark.parametrize("cfg, component, j, message", BAD_OPTIONS + BAD_OPTIONS_WITHOUT_TIME)
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


# -- one real job, reused: status at once, requeue, logs of both attempts, its directory -------

REQUEUE_ARGS = ["--model", "tiny", "--steps", "300", "--batch-size", "16", "--eval-every", "0",
                "--tensorboard", "false", "--log-every", "100"]


@pytest.fixture(scope="module")
def requeued_job(slurm_cluster, tmp_path_factory) -> dict:
    """A one-node job submitted like a user would (the repository's .torchxconfig profile, so
    job_dir=slurm-jobs under the submitting directory, and the repository as workspace), asked
    for its status the moment ``torchx run`` returns, requeued with ``scontrol requeue`` once it
    logged its first step, and run to the end."""
    cwd = tmp_path_factory.mktemp("requeue")
    proc = torchx("run", "-s", "slurm", "--workspace", f"file://{REPO}",
                  str(REPO / "components" / "ddp.py") + ":ddp", "-j", "1x2", "--", *REQUEUE_ARGS,
                  cwd=cwd, env={"TORCHXCONFIG": str(REPO / ".torchxconfig")})
    handle = proc.stdout.strip().splitlines()[-1]
    assert handle.startswith("slurm://"), proc.stdout + proc.stderr[-2000:]
    first_status = torchx("status", handle, cwd=cwd, check=False)
    app_id = handle.rsplit("/", 1)[-1]
    blind = create_scheduler("test")  # accounting that does not know the job yet
    blind._sacct_jobs = lambda *args: []  # type: ignore[method-assign]
    from_queue = blind.describe(app_id)

    out = job_dir(cwd, handle) / f"slurm-{app_id}-ddp-0.out"
    deadline = time.monotonic() + 300
    while not re.search(r"step +\d+/300", out.read_text() if out.exists() else ""):
        assert time.monotonic() < deadline, f"{handle} logged no step in 300 s"
        time.sleep(0.5)
    subprocess.run(["scontrol", "requeue", app_id], check=True)
    requeued = time.monotonic()
    scheduler = create_scheduler("test")
    while True:
        desc = scheduler.describe(app_id)
        if desc is not None and desc.num_restarts >= 1 and desc.state != AppState.PENDING:
            break
        assert time.monotonic() < requeued + 300, f"{handle} did not run again in 300 s"
        time.sleep(0.5)
    requeue_wait = time.monotonic() - requeued
    final = wait(handle)
    return {"cwd": cwd, "handle": handle, "first_status": first_status,
            "from_queue": from_queue, "requeue_wait": requeue_wait, "final": final}


@pytest.mark.slow
def test_status_right_after_submission_is_pending_or_running(requeued_job):
    proc = requeued_job["first_status"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"State: (PENDING|RUNNING)", proc.stdout), proc.stdout
    desc = requeued_job["from_queue"]  # what squeue says while sacct knows nothing of the job
    assert desc is not None and desc.state in {AppState.PENDING, AppState.RUNNING}, desc
    assert [(r.name, r.num_replicas) for r in desc.roles] == [("ddp", 1)]


@pytest.mark.slow
def test_requeued_job_runs_again_within_seconds(requeued_job):
    """cred_expire=10 s, then .ci/slurm-up's EpilogSlurmctld nudge (measured ~13 s): from the
    end of the first attempt to the start of the second in Slurm's accounting, as for the
    preempted job. The test's own clock from ``scontrol requeue`` also counts the first
    attempt's ranks dying, which on a loaded CI machine took it to 36 s."""
    assert requeued_job["final"] == AppState.SUCCEEDED
    waits = restart_waits(requeued_job["handle"])
    assert len(waits) == 1 and waits[0] <= 30, (waits, requeued_job["requeue_wait"])
    assert "Num Restarts: 1" in status(requeued_job["cwd"], requeued_job["handle"])


@pytest.mark.slow
def test_log_shows_every_attempts_training_lines_by_default(requeued_job):
    cwd, handle = requeued_job["cwd"], requeued_job["handle"]
    attempts = attempts_of(torchx("log", f"{handle}/ddp/0", cwd=cwd).stdout)
    assert sorted(attempts) == [1, 2], attempts
    assert any(re.search(r"step +\d+/300", line) for line in attempts[1]), attempts[1]
    assert any(re.search(r"step 300/300", line) for line in attempts[2]), attempts[2]
    assert any("summary: model=tiny" in line for line in attempts[2]), attempts[2]
    errors = attempts_of(torchx("log", "--streams", "stderr", f"{handle}/ddp/0", cwd=cwd).stdout)
    assert sorted(errors) == [1, 2], errors
    assert not any(re.search(r"step +\d+/300", line) for lines in errors.values()
                   for line in lines)


@pytest.mark.slow
def test_requeued_job_resumes_where_it_was_stopped(requeued_job):
    """``scontrol requeue`` (the path Slurm's preemption takes) sends every process SIGTERM and
    waits KillWait: the ranks save the step they were in, and the next attempt resumes there,
    without ``signal_grace``."""
    cwd, handle = requeued_job["cwd"], requeued_job["handle"]
    attempts = attempts_of(torchx("log", f"{handle}/ddp/0", cwd=cwd).stdout)
    saved = [int(m.group(1)) for line in attempts[1]
             if (m := re.search(r"preempted by SIGTERM after step (\d+): saved", line))]
    resumed = [int(m.group(1)) for line in attempts[2]
               if (m := re.search(r"resumed from \S+ at step (\d+)", line))]
    assert len(saved) == 1 and resumed == saved, (saved, resumed)


@pytest.mark.slow
def test_job_dir_holds_the_sources_snapshot_only(requeued_job):
    """The snapshot is made at submission and trains; it has the sources, none of the
    virtualenvs, git, earlier jobs, outputs or downloaded wheels of the workspace."""
    cwd, handle = requeued_job["cwd"], requeued_job["handle"]
    app_id = handle.rsplit("/", 1)[-1]
    directory = job_dir(cwd, handle)
    assert directory.parent == cwd / "slurm-jobs"
    assert (directory / "components" / "ddp.py").read_bytes() == \
        (REPO / "components" / "ddp.py").read_bytes()
    assert (directory / "outputs" / app_id / "summary.json").exists()  # it trained there
    top = {p.name for p in directory.iterdir()}
    assert not {".git", "slurm-jobs", ".torchxslurmjobdirs"} & top, top
    assert not [name for name in top if name.startswith(".venv")], top
    assert [p.name for p in (directory / "outputs").iterdir()] == [app_id]
    assert not list((directory / "images").glob("wheels/*.whl"))
    job_files = {f"slurm-{app_id}.out", f"slurm-{app_id}-ddp-0.out",
                 f"slurm-{app_id}-ddp-0.err", "torchx-sbatch.sh"}
    # (__pycache__: the bytecode the job's own imports wrote there, not the workspace's)
    snapshot = [p for p in directory.rglob("*") if p.is_file()
                and p.relative_to(directory).parts[0] not in {"outputs", *job_files}
                and "__pycache__" not in p.parts]
    size = sum(p.stat().st_size for p in snapshot)
    assert size < 5 * 2**20, f"{size / 2**20:.1f} MiB in {len(snapshot)} files"


def test_signal_grace_renders_signal_trap_and_requeue(slurm_cluster, tmp_path):
    """Every heterogeneous component asks for the signal; the script traps it, runs srun in the
    background and requeues after it; torchrun's signal list travels whole (srun --export would
    split it at its commas)."""
    proc = torchx("run", "--dryrun", "-s", "slurm", "--workspace", "", "-cfg",
                  "partition=debug,time=1:00:00,signal_grace=300",
                  str(REPO / "components" / "ddp.py") + ":ddp", "-j", "2x1", "--",
                  *trainer_args(), cwd=tmp_path)
    script = proc.stdout.split("=== SCHEDULER REQUEST ===", 1)[1]
    groups = [line for line in script.splitlines() if line.startswith("#SBATCH --job-name")]
    assert len(groups) == 2 and all("--signal=B:USR1@300" in g.split() for g in groups), groups
    trap, srun, requeue = (script.index(s) for s in ("trap forward USR1", "\nsrun ",
                                                     'scontrol requeue "$SLURM_JOB_ID"'))
    assert trap < srun < requeue and "' &\nsrun_pid=$!" in script
    assert script.count(" env PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 "
                        "bash -c ") == 2
    assert "--export=ALL" in script and ",PET_SIGNALS_TO_HANDLE" not in script


def test_dry_run_writes_nothing(slurm_cluster, tmp_path):
    """``torchx run --dryrun`` with the repository's profile (job_dir=slurm-jobs) and a
    workspace: the request names the job's directory, nothing is created or changed."""
    (tmp_path / "slurm-jobs" / "ddp-earlier").mkdir(parents=True)
    (tmp_path / "slurm-jobs" / "ddp-earlier" / "slurm-1.out").write_text("earlier job\n")

    def tree() -> dict[str, int]:
        return {str(p): p.stat().st_mtime_ns for p in [tmp_path, *tmp_path.rglob("*")]}

    before = tree()
    proc = torchx("run", "--dryrun", "-s", "slurm", "--workspace", f"file://{REPO}",
                  str(REPO / "components" / "ddp.py") + ":ddp", "-j", "2x1", "--",
                  *trainer_args(), cwd=tmp_path, env={"TORCHXCONFIG": str(REPO / ".torchxconfig")})
    assert tree() == before
    request = proc.stdout.split("=== SCHEDULER REQUEST ===", 1)[1]
    assert re.search(rf"# At submission: {tmp_path}/slurm-jobs/ddp-\d{{8}}-\d{{6}}-[0-9a-f]{{4}} "
                     rf"is made with a snapshot of file://{REPO} ", request), request
    assert request.startswith("\nsbatch --parsable --open-mode=append ")
    assert request.count("--kill-on-bad-exit=1 --open-mode=append") == 2  # srun, each node
    assert 'attempt="==== torchx: job $SLURM_JOB_ID attempt' in request


# -- preemption and time limits (signal_grace): save, requeue, resume ---------------------------

PREEMPT_STEPS = 400  # attempt 1 must still train when scancel signals it
PREEMPT_ARGS = trainer_args("--checkpoint-every", "0", steps=PREEMPT_STEPS)
GRACE = 90  # s: with the limit lowered to 60-120 s ahead, Slurm's warning is due at once


def _replica_attempts(cwd: Path, handle: str, replicas: int) -> list[dict[int, list[str]]]:
    """Each replica's log file split into attempts (:func:`attempts_of`)."""
    app_id = handle.rsplit("/", 1)[-1]
    files = [job_dir(cwd, handle) / f"slurm-{app_id}-ddp-{k}.out" for k in range(replicas)]
    return [attempts_of(f.read_text() if f.exists() else "") for f in files]


def _logged(cwd: Path, handle: str, attempt: int, pattern: str) -> list[re.Match[str]]:
    """The matches of ``pattern`` in attempt ``attempt`` of both replicas' logs (rank 0, which
    prints, may run on either node in any attempt)."""
    return [match for log in _replica_attempts(cwd, handle, 2) for line in log.get(attempt, [])
            if (match := re.search(pattern, line))]


def _wait_until(what: str, ready: Callable[[], object], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout:.0f} s"
        time.sleep(0.5)


def _requeues(app_id: str) -> int:
    desc = create_scheduler("test").describe(app_id)
    return desc.num_restarts if desc is not None else 0


def _forwarded_signals(cwd: Path, handle: str) -> int:
    """How often the job script logged forwarding a SIGUSR1 to the tasks (in its own log,
    ``slurm-<id>.out``, over every attempt)."""
    log = job_dir(cwd, handle) / f"slurm-{handle.rsplit('/', 1)[-1]}.out"
    text = log.read_text() if log.exists() else ""
    return sum(line.startswith("torchx: SIGUSR1 at ") for line in text.splitlines())


def _trainer_pids(app_id: str) -> list[int]:
    """The trainer processes of Slurm job ``app_id`` on this machine (both nodes run here):
    torchrun's workers, whose environment carries the job id and their local rank."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue  # not a process, or one that ended
        if b"trainers.ddp" in cmdline and b"SLURM_JOB_ID=" + app_id.encode() in environ \
                and any(var.startswith(b"LOCAL_RANK=") for var in environ):  # not torchrun
            pids.append(int(proc.name))
    return pids


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        os.kill(pid, sig)


def _elapsed_s(app_id: str) -> int:
    """Seconds the job's current attempt has run (``squeue %M``: [[D-]H:]M:SS)."""
    text = subprocess.run(["squeue", "-h", "-j", app_id, "-o", "%M"], capture_output=True,
                          text=True, check=True).stdout.split()[0]
    days, _, clock = text.rpartition("-")
    seconds = 0
    for part in clock.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds + int(days or 0) * 86400


@pytest.fixture(scope="module")
def preempted_job(slurm_cluster, tmp_path_factory) -> dict:
    """A two-node job with ``signal_grace`` and ``--checkpoint-every 0`` (so every checkpoint
    but the last is a preemption save), beside the same run uninterrupted on one node:

    * attempt 1 is sent SIGUSR1 the way an operator preempts a job, ``scancel --batch
      --signal=USR1``, once it logged a step;
    * attempt 2 gets a time limit shorter than its run: once it logged a step, its trainers are
      stopped (SIGSTOP, so that however fast this machine trains they are still mid-run when
      Slurm's warning comes) and its limit is lowered (``scontrol update TimeLimit``) to end
      60-120 s later, so with a 90 s grace Slurm's own ``--signal`` warning is due at its next
      time-limit check (every 30 s); once the job script logged that it forwarded the warning,
      the trainers continue (SIGCONT) and act on it;
    * attempt 3, its limit back at 15 minutes, runs to the end."""
    cwd = tmp_path_factory.mktemp("preempt")
    reference = submit(cwd, "ddp", "1x2", PREEMPT_ARGS)
    handle = submit(cwd, "ddp", "2x1", PREEMPT_ARGS, cfg=f"signal_grace={GRACE}")
    app_id = handle.rsplit("/", 1)[-1]
    _wait_until(f"{handle} logging a step",
                lambda: _logged(cwd, handle, 1, rf"step +\d+/{PREEMPT_STEPS}"))
    subprocess.run(["scancel", "--batch", "--signal=USR1", app_id], check=True)
    _wait_until(f"{handle} resuming", lambda: _logged(cwd, handle, 2, "resumed from"))
    _wait_until(f"{handle} training again",  # so that its save is of a step of its own
                lambda: _logged(cwd, handle, 2, rf"step +\d+/{PREEMPT_STEPS}"))
    trainers = _trainer_pids(app_id)
    assert len(trainers) == 2, trainers  # one rank per node
    _signal_all(trainers, signal.SIGSTOP)
    try:
        minutes = (_elapsed_s(app_id) + 60) // 60 + 1
        subprocess.run(["scontrol", "update", f"JobId={app_id}", f"TimeLimit={minutes}"],
                       check=True)
        _wait_until(f"{handle} forwarding Slurm's time-limit warning",
                    lambda: _forwarded_signals(cwd, handle) >= 2, timeout=120)
    finally:
        _signal_all(trainers, signal.SIGCONT)
    _wait_until(f"{handle} requeued on its time limit", lambda: _requeues(app_id) >= 2)
    subprocess.run(["scontrol", "update", f"JobId={app_id}", "TimeLimit=15"], check=True)
    return {"cwd": cwd, "handle": handle, "reference": reference, "final": wait(handle),
            "reference_final": wait(reference)}


@pytest.mark.slow
def test_preempted_and_time_limited_job_matches_the_uninterrupted_run(preempted_job):
    cwd, handle = preempted_job["cwd"], preempted_job["handle"]
    assert preempted_job["final"] == preempted_job["reference_final"] == AppState.SUCCEEDED
    assert "Num Restarts: 2" in status(cwd, handle)
    assert_same_run(run_dir(cwd, handle), run_dir(cwd, preempted_job["reference"]), cwd)


@pytest.mark.slow
def test_each_requeue_loses_at_most_one_step(preempted_job):
    """Attempts 1 and 2 each saved the step they were in on SIGUSR1 (from scancel, then from
    Slurm's time-limit warning); attempts 2 and 3 resumed from it, and each counted at most one
    step trained again (``steps_lost`` in its summary line)."""
    cwd, handle = preempted_job["cwd"], preempted_job["handle"]
    saved = sorted(int(p.name.rsplit("_", 1)[1]) for p in
                   (run_dir(cwd, handle) / "checkpoints").glob("step_*"))
    assert len(saved) == 3 and saved[-1] == PREEMPT_STEPS, saved
    for attempt, step in ((2, saved[0]), (3, saved[1])):
        assert [int(m.group(1)) for m in _logged(cwd, handle, attempt,
                                                 r"resumed from \S+ at step (\d+)")] == [step]
        lost = [int(m.group(1)) for m in _logged(cwd, handle, attempt, r"steps_lost=(\d+)")]
        assert lost and max(lost) <= 1, (attempt, lost)
    app_id = handle.rsplit("/", 1)[-1]
    errors = [attempts_of((job_dir(cwd, handle) / f"slurm-{app_id}-ddp-{k}.err").read_text())
              for k in (0, 1)]
    for attempt in (1, 2):
        assert _logged(cwd, handle, attempt, r"got SIGUSR1: saving at the end of this step")
        # torchrun caught SIGUSR1 (PET_SIGNALS_TO_HANDLE arrived whole) instead of dying of it
        assert all(any("Received 10 death signal" in line for line in log[attempt])
                   for log in errors), attempt
    result = summary(cwd, handle)
    assert (result["restarts"], result["resumed_from_step"]) == (2, saved[1]), result
    assert result["steps_lost"] <= 1 and result["preempted"] is None, result


@pytest.mark.slow
def test_preempted_job_runs_again_within_seconds(preempted_job):
    waits = restart_waits(preempted_job["handle"])
    assert len(waits) == 2 and all(w <= 30 for w in waits), waits

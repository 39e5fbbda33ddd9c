"""Helpers for the tests that submit to the real Slurm cluster of ``.ci/slurm-up`` (partition
``debug``, nodes tt-node1 and tt-node2): the CLI, submission, waiting, where a job ran.

``slurm_cluster`` is registered as a fixture for every test module (tests/conftest.py lists
this module in ``pytest_plugins``); it skips a test when no cluster answers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest
from torchx.specs import AppState

from components.schedulers.slurm import create_scheduler
from tests.support.runs import REPO, torchx_cli

TERMINAL = {AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED}


def trainer_args(*extra: str, steps: int = 30, batch_size: int = 16,
                 log_every: int = 10) -> list[str]:
    """Short tiny-model runs (torchx refuses a repeated option, so they are built here)."""
    return ["--model", "tiny", "--steps", str(steps), "--batch-size", str(batch_size),
            "--eval-every", "0", "--tensorboard", "false", "--log-every", str(log_every),
            *extra]


def torchx(*args: str, cwd: Path, env: dict[str, str] | None = None, check: bool = True,
           timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """:func:`tests.support.runs.torchx_cli`, raising on a non-zero exit if ``check``."""
    proc = torchx_cli(*args, cwd=cwd, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"torchx {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc


def submit(cwd: Path, component: str, j: str, args: list[str], *options: str,
           cfg: str = "") -> str:
    """``torchx run -s slurm`` with the repository as workspace, ``options`` for the
    component (e.g. --max_retries 1) and ``cfg`` added to the run options; returns the app
    handle."""
    proc = torchx("run", "-s", "slurm", "--workspace", f"file://{REPO}",
                  "-cfg", f"partition=debug,time=15,job_dir={cwd / 'jobs'}"
                  + (f",{cfg}" if cfg else ""),
                  str(REPO / "components" / f"{component}.py") + f":{component}", "-j", j,
                  *options, "--", *args, cwd=cwd)
    handle = re.search(r"^slurm://\S+$", proc.stdout, re.M)
    assert handle, proc.stdout + proc.stderr[-2000:]
    return handle.group(0)


def wait(handle: str, states: set[AppState] = TERMINAL, timeout: float = 600) -> AppState:
    """Poll the job until it reaches one of ``states``; its state then. A job that does not
    is cancelled (so the tests after it find the nodes free) and the error shows where it was
    (:func:`stuck_job_report`)."""
    scheduler = create_scheduler("test")
    app_id = handle.rsplit("/", 1)[-1]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        desc = scheduler.describe(app_id)
        if desc is not None and desc.state in states:
            return desc.state
        time.sleep(1)
    raise AssertionError(f"{handle} did not reach {states} in {timeout:.0f}s; cancelled it\n"
                         + stuck_job_report(app_id))


def stuck_job_report(app_id: str, lines: int = 80) -> str:
    """Where a job that should have ended is, then cancel it (so the tests after it find the
    nodes free): ``squeue``'s line for each component; then its trainers, or the torchrun
    agents where no trainer runs, are sent SIGABRT (the tests start jobs with Python's fault
    handler on, :func:`tests.support.runs.child_env`, so each prints its threads' stacks to
    its log) and the last ``lines`` of each log file in its working directory
    (``slurm-<id>*``) follow."""
    queue = subprocess.run(["squeue", "-h", "-j", app_id, "-o", "%i|%T|%M|%N|%Z"],
                           capture_output=True, text=True).stdout
    workdirs = {Path(line.split("|")[-1]) for line in queue.splitlines()
                if line.count("|") == 4 and line.split("|")[-1]}
    processes = [p for d in workdirs for p in processes_in(d)]
    aborted = ([pid for pid, cmd in processes if "-m trainers." in cmd and "torchrun" not in cmd]
               or [pid for pid, cmd in processes if "torchrun" in cmd])
    for pid in aborted:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGABRT)
    time.sleep(5 if aborted else 0)  # the stacks reach the logs
    subprocess.run(["scancel", app_id], capture_output=True)
    parts = [f"squeue: {queue.strip() or '(not queued)'}",
             f"aborted (SIGABRT, for their stacks): {aborted or 'nothing'}"]
    for log in sorted(p for d in workdirs for p in d.glob(f"slurm-{app_id}*")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {log.name} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "\n".join(parts)


def processes_in(workdir: Path) -> list[tuple[int, str]]:
    """(pid, command line) of this machine's processes whose working directory is
    ``workdir``: a job's on the local cluster, whose nodes all run here."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if Path(os.readlink(proc / "cwd")) == workdir:
                found.append((int(proc.name),
                              (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
    return found


def job_dir(cwd: Path, handle: str) -> Path:
    """Where the job ran: torchx records it in .torchxslurmjobdirs in the submitting dir."""
    app_id = handle.rsplit("/", 1)[-1]
    dirs = dict(line.split(" = ") for line in (cwd / ".torchxslurmjobdirs").read_text()
                .splitlines())
    return Path(dirs[app_id])


def run_dir(cwd: Path, handle: str) -> Path:
    """The job's default run directory, ``<job dir>/outputs/<app id>``."""
    return job_dir(cwd, handle) / "outputs" / handle.rsplit("/", 1)[-1]


def summary(cwd: Path, handle: str) -> dict[str, float]:
    return json.loads((run_dir(cwd, handle) / "summary.json").read_text())


def status(cwd: Path, handle: str) -> str:
    return torchx("status", handle, cwd=cwd).stdout


def restart_waits(handle: str) -> list[float]:
    """Seconds from the end of each attempt of a requeued job to the start of the next, from
    ``sacct --duplicates`` (one second resolution; the first component of a heterogeneous
    job)."""
    app_id = handle.rsplit("/", 1)[-1]
    proc = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", app_id, "-o", "JobID,Start,End"],
                          capture_output=True, text=True, check=True)
    attempts = [line.split("|")[1:] for line in proc.stdout.splitlines()
                if line.split("|")[0] in (app_id, f"{app_id}+0")]
    stamp = "%Y-%m-%dT%H:%M:%S"
    return [(datetime.strptime(start, stamp) - datetime.strptime(end, stamp)).total_seconds()
            for (_, end), (start, _) in zip(attempts, attempts[1:], strict=False)]


ATTEMPT = re.compile(r"^==== torchx: job (\d+) attempt (\d+) started \S+ ====$")


def attempts_of(log: str) -> dict[int, list[str]]:
    """A replica's log (what ``torchx log APP/ROLE/0`` prints, or the file) split at the
    attempt lines that the job script writes: {attempt: its lines}."""
    attempts: dict[int, list[str]] = {}
    current = 0
    for line in log.splitlines():
        line = re.sub(r"^\S+/\d+ ", "", re.sub(r"\x1b\[[0-9;]*m", "", line))  # torchx's prefix
        match = ATTEMPT.match(line)
        if match:
            current = int(match.group(2))
            attempts[current] = []
        else:
            attempts.setdefault(current, []).append(line)
    return attempts


def queued_jobs_from(directory: Path) -> list[str]:
    """``squeue``'s "ID WORKDIR" lines of the jobs submitted from, or run in, ``directory``
    (jobs of other users and directories on a shared cluster are left out)."""
    proc = subprocess.run(["squeue", "-h", "-o", "%i %Z"], capture_output=True, text=True,
                          check=True)
    return [line for line in proc.stdout.splitlines()
            if line.split(" ", 1)[-1].startswith(str(directory))]


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """The local cluster of .ci/slurm-up, answering and with both nodes up."""
    if shutil.which("sinfo") is None:
        pytest.skip("no Slurm here: start a local cluster with `sudo .ci/slurm-up`")
    nodes = subprocess.run(["sinfo", "-h", "-N", "-p", "debug", "-o", "%N %T"],
                           capture_output=True, text=True)
    up = [line for line in nodes.stdout.splitlines()
          if line.split()[-1].rstrip("*") in {"idle", "mixed", "allocated", "completing",
                                              "planned"}]
    if nodes.returncode != 0 or len(up) < 2:
        pytest.skip(f"the Slurm cluster is not up ({nodes.stderr.strip() or nodes.stdout!r}): "
                    "run `sudo .ci/slurm-up`")

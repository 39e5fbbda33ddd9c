"""Preemption: a signal to a running job makes every rank save the step they agree on and exit
128+signal; the restarted (or rerun) job resumes from that checkpoint and ends where an
uninterrupted run does (fp32 CPU: losses and final weights within 1e-6 relative).

The Slurm, Kubernetes and Ray paths are proven in their own test modules; here: the signal
handling itself, a signal to one worker under torchrun (which restarts the workers in place)
and ``torchx cancel`` (from another process) and Ctrl-C of a ``local_cwd`` job, each followed by
the same command again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.support.processes import Launched, run_command, start, torchrun
from tests.support.runs import (
    TINY,
    assert_same_run,
    run_trainer,
    torchx_cli,
    without,
)
from trainers.core.preemption import PreemptionWatch
from trainers.errors import ConfigError
from trainers.runs.checkpoint_files import find_checkpoints
from trainers.runs.preemption_signals import exit_status, parse_signals

# 150 tiny steps (about 5 s on 2 ranks) with no periodic checkpoint: whatever a signal saves is
# the preemption checkpoint.
ARGS = [*without(TINY, "--steps", "--resume", "--log-every"), "--steps", "150",
        "--checkpoint-every", "0", "--resume", "auto", "--log-every", "10"]


@pytest.mark.parametrize("value, names", [
    ("SIGTERM,SIGUSR1", ["SIGTERM", "SIGUSR1"]),
    ("term, usr2", ["SIGTERM", "SIGUSR2"]),
    ("SIGINT,SIGINT", ["SIGINT"]),
    ("none", []),
])
def test_signal_names_parse(value, names):
    assert [s.name for s in parse_signals(value)] == names


@pytest.mark.parametrize("value, error", [
    ("SIGTERM,SIGFOO", "SIGFOO is not a signal; pass names such as SIGTERM,SIGUSR1"),
    ("TERM,", "an empty name is not a signal"),
    ("SIGSTOP", "SIGSTOP cannot be caught, so no checkpoint can be saved on it"),
])
def test_bad_signal_names_are_refused(value, error):
    with pytest.raises(ConfigError, match=error):
        parse_signals(value)


def test_a_signal_is_recorded_once_and_the_handlers_come_back(world_of_one):
    before = signal.getsignal(signal.SIGUSR1)
    with PreemptionWatch((signal.SIGUSR1, signal.SIGTERM), world_of_one) as watch:
        assert watch.agreed() is None
        signal.raise_signal(signal.SIGUSR1)
        signal.raise_signal(signal.SIGTERM)  # a second signal, say during the save
        assert watch.agreed() is signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) is before
    assert exit_status(signal.SIGUSR1) == 138 and exit_status(signal.SIGTERM) == 143


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """ARGS run uninterrupted on 2 ranks."""
    run_dir = tmp_path_factory.mktemp("reference")
    run_trainer([*ARGS, "--output-dir", str(run_dir)], nproc=2)
    return run_dir


def wait_for_step(run_dir: Path, step: int, job: Launched, timeout: float = 180) -> None:
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= step):
        assert job.popen.poll() is None, job.describe(
            f"the job ended ({job.popen.returncode}) before step {step}")
        assert time.monotonic() < deadline, job.describe(f"no step {step} in {timeout} s")
        time.sleep(0.1)


def workers(agent: int) -> dict[int, int]:
    """{rank: pid} of the trainer processes torchrun ``agent`` started."""
    children = Path(f"/proc/{agent}/task/{agent}/children").read_text().split()
    ranks = {}
    for pid in map(int, children):
        environ = dict(item.split("=", 1) for item in
                       Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
        if "RANK" in environ:
            ranks[int(environ["RANK"])] = pid
    return ranks


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.slow
def test_signal_to_one_worker_saves_the_step_all_ranks_agree_on(tmp_path, reference):
    """SIGUSR1 (twice) to rank 1 alone: both ranks save the same step and exit 138; torchrun
    (--max_restarts 1) restarts them in place, they resume from that step and finish as the
    uninterrupted run did, with no step lost."""
    run_dir = tmp_path / "run"
    job = torchrun("trainers.ddp", [*ARGS, "--output-dir", str(run_dir)], 2,
                   options=["--max_restarts", "1"])
    wait_for_step(run_dir, 20, job)
    rank1 = workers(job.pid)[1]
    os.kill(rank1, signal.SIGUSR1)
    with contextlib.suppress(ProcessLookupError):  # gone already, or saving
        os.kill(rank1, signal.SIGUSR1)
    done = job.wait(300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, job.describe(f"exit {done.returncode}")
    saved = int(out.split("preempted by SIGUSR1 after step ")[1].split(":")[0])
    assert "failed (exitcode: 138)" in out  # the failure torchrun restarted
    result = summary(run_dir)
    assert (result["restarts"], result["resumed_from_step"], result["preempted"]) == \
        (1, saved, None)
    assert result["steps_lost"] <= 1
    assert_same_run(run_dir, reference, tmp_path)


@pytest.mark.slow
def test_torchx_cancel_or_ctrl_c_of_a_local_job_saves_and_the_same_command_resumes(
        tmp_path, reference):
    """``torchx status``/``torchx cancel`` from another process reach a local_cwd job; the
    cancel's SIGTERM is forwarded by torchrun and both ranks save the step they were on. The
    same ``torchx run`` again resumes there; Ctrl-C (SIGINT) to it saves likewise; the third
    run ends as the uninterrupted run did."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "torchx.cli.main", "run", "-s", "local_cwd",
               "components/ddp.py:ddp", "-j", "1x2", "--", *ARGS, "--output-dir", str(run_dir)]

    proc = start(command, label="torchx-run-preempted")
    wait_for_step(run_dir, 20, proc)
    handle = proc.wait_for("^local_cwd://", 30).splitlines()[0].strip()
    status = torchx_cli("status", handle)
    assert "State: RUNNING" in status.stdout, status.stdout + status.stderr
    cancel = torchx_cli("cancel", handle)
    assert cancel.returncode == 0, cancel.stderr
    proc.wait(120)
    first = summary(run_dir)
    assert first["preempted"] == "SIGTERM", proc.describe("not preempted")
    saved = first["saved_step"]
    assert [p.name for p in find_checkpoints(run_dir / "checkpoints")] == [f"step_{saved:08d}"]
    assert torchx_cli("status", handle).returncode != 0  # gone: nothing left to report

    proc = start(command, label="torchx-run-interrupted")
    wait_for_step(run_dir, saved + 20, proc)
    proc.popen.send_signal(signal.SIGINT)  # Ctrl-C: torchx sends SIGTERM to the job's processes
    proc.wait(120)
    second = summary(run_dir)
    assert (second["preempted"], second["resumed_from_step"]) == ("SIGTERM", saved), \
        proc.describe("not preempted")
    assert second["saved_step"] > saved and second["steps_lost"] <= 1

    rerun = run_command(command)
    assert "Job finished: SUCCEEDED" in rerun.stderr, rerun.stderr[-4000:]
    result = summary(run_dir)
    assert (result["resumed_from_step"], result["preempted"]) == (second["saved_step"], None)
    assert result["steps_lost"] <= 1
    assert_same_run(run_dir, reference, tmp_path)

"""Runs whose run directory is a bucket on a real S3 endpoint (moto's server: tests/support/s3.py)
survive what runs on disk survive: a worker killed by SIGKILL, a crash in the middle of a
checkpoint upload, and a SIGTERM preemption, each resumed from the bucket alone and ending where
an uninterrupted 2-rank FSDP run on disk does (fp32 CPU: losses and final weights within 1e-6
relative). Checkpoints are committed by their manifest, with no rename: a step without one is
skipped on resume and never left behind.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import fsspec
import pytest

from tests.support.processes import torchrun
from tests.support.runs import (
    REPO,
    TINY,
    assert_same_run,
    losses,
    run_trainer,
    torchx_cli,
    without,
)
from tests.support.s3 import Bucket

ARGS = [*without(TINY, "--steps", "--resume"), "--steps", "10", "--checkpoint-every", "4",
        "--resume", "auto"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """ARGS run uninterrupted by trainers.fsdp on 2 ranks, on disk."""
    run_dir = tmp_path_factory.mktemp("fsdp") / "reference"
    run_trainer([*ARGS, "--output-dir", str(run_dir)], nproc=2, module="trainers.fsdp")
    return run_dir


def fetch(url: str, local: Path) -> Path:
    """A copy of the run at ``url`` in ``local`` (through fsspec, as a user would look)."""
    fs, path = fsspec.core.url_to_fs(url)
    fs.get(path, str(local), recursive=True)
    return local


def attempts_ends(output: str) -> str:
    """``output`` without its step lines, so a failing job's message shows every attempt's end."""
    return "".join(line for line in output.splitlines(keepends=True) if " | loss " not in line)


def steps_in(bucket: Bucket, run: str) -> dict[str, bool]:
    """``step_<N>`` prefixes under ``run``'s checkpoints -> whether each is committed."""
    keys = bucket.keys(f"{run}/checkpoints/")
    steps = {key.split("/")[2] for key in keys}
    return {step: f"{run}/checkpoints/{step}/manifest.json" in keys for step in sorted(steps)}


@pytest.mark.slow
# steps_lost counts the steps redone that metrics.jsonl in the bucket had recorded. It is synced
# at every checkpoint commit (step 4's, after step 5) and when a rank's loop ends on an error.
@pytest.mark.parametrize("kill, lost", [
    # rank 1 dies after step 6 (SIGKILL); rank 0's collective fails and it syncs steps 1-6
    ("1:6", 2),
    # rank 0 dies inside the step-8 upload, its lines since step 5 with it; step 8 is skipped
    ("0:8:upload", 1),
], ids=["sigkill", "crash-mid-upload"])
def test_a_killed_fsdp_run_resumes_from_the_bucket(s3, tmp_path, reference, kill, lost):
    run = s3.url("fsdp")
    proc = torchx_cli("run", "-s", "local_cwd", "components/fsdp.py:fsdp", "-j", "1x2",
                      "--max_retries", "1", "--env", f"TRAINERS_KILL_AT={kill}", "--",
                      *ARGS, "--output-dir", run)
    assert "Job finished: SUCCEEDED" in proc.stderr, attempts_ends(proc.stderr)[-12000:]
    rank, step, *_ = kill.split(":")
    assert f"killing rank {rank} at step {step}" in proc.stderr
    local = fetch(run, tmp_path / "faulted")
    summary = json.loads((local / "summary.json").read_text())
    assert (summary["restarts"], summary["steps_lost"], summary["resumed_from_step"]) == \
        (1, lost, 4)
    assert steps_in(s3, "fsdp") == {"step_00000004": True, "step_00000008": True,
                                    "step_00000010": True}
    assert "resumed from s3://" in (local / "console.log").read_text()
    assert not (REPO / "s3:").exists()  # no local folder named after the URL
    assert_same_run(local, reference, tmp_path)


@pytest.mark.slow
def test_sigterm_saves_to_the_bucket_and_the_restart_loses_at_most_one_step(s3, tmp_path):
    """SIGTERM to both workers under torchrun (--max_restarts 1), as a node's drain sends it:
    they save the step they agree on into the bucket and exit 143; the restarted workers resume
    from it and end where an uninterrupted run does."""
    args = [*without(ARGS, "--steps", "--checkpoint-every"), "--steps", "40",
            "--checkpoint-every", "0"]
    long_reference = tmp_path / "long-reference"
    job = torchrun("trainers.fsdp", [*args, "--output-dir", s3.url("preempted")], 2,
                   options=["--max_restarts", "1"])
    job.wait_for(r"step +10/40 ", 180)  # rank 0's step lines: the run is well under way
    for worker in job.popen_children():
        worker.send_signal(signal.SIGTERM)
    done = job.wait(300)
    out = done.stdout
    assert done.returncode == 0, job.describe(f"exit {done.returncode}")
    assert "preempted by SIGTERM after step " in out, out[-4000:]
    saved = int(out.split("preempted by SIGTERM after step ")[1].split(":")[0])
    local = fetch(s3.url("preempted"), tmp_path / "preempted")
    summary = json.loads((local / "summary.json").read_text())
    assert (summary["restarts"], summary["resumed_from_step"], summary["preempted"]) == \
        (1, saved, None)
    assert summary["steps_lost"] <= 1
    run_trainer([*args, "--output-dir", str(long_reference)], nproc=2, module="trainers.fsdp")
    assert_same_run(local, long_reference, tmp_path)


@pytest.mark.slow
def test_a_run_on_disk_resumes_from_one_checkpoint_in_the_bucket(s3, tmp_path):
    """``--resume s3://.../checkpoints/step_N`` starts a run on disk from a bucket run's step N:
    its steps after N equal the bucket run's."""
    args = [*without(TINY, "--resume"), "--checkpoint-every", "4"]
    run_trainer([*args, "--output-dir", s3.url("first"), "--resume", "none"])
    first = fetch(s3.url("first"), tmp_path / "first")
    step_4 = s3.url("first", "checkpoints", "step_00000004")
    proc = run_trainer([*args, "--output-dir", str(tmp_path / "second"), "--resume", step_4])
    assert f"resumed from {step_4} at step 4" in proc.stdout
    second = losses(tmp_path / "second")
    assert second == {step: loss for step, loss in losses(first).items() if step > 4}

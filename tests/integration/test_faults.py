"""Faults injected into real runs on disk: a crash in the middle of a checkpoint save (one
variant kills a worker after a step), a truncated checkpoint and a full disk. A worker killed
mid-run, restarted by torchrun and resumed is also proven for 2-rank FSDP on a bucket
(tests/integration/test_s3_checkpoints.py). The restarted run must end where an
uninterrupted one does (fp32 CPU: losses and final weights within 1e-6 relative)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support.processes import run_command
from tests.support.runs import TINY, assert_same_run, losses, run_trainer, torchx_cli, without
from trainers.errors import ConfigError
from trainers.runs.checkpoint_files import find_checkpoints, step_dirs, verify
from trainers.runs.faults import KillPoint, kill_point

STEPS = ["--steps", "10", "--checkpoint-every", "4", "--resume", "auto"]


def run_component(component: str, run_dir: Path, extra: list[str], *options: str) -> str:
    """``torchx run -s local_cwd`` of ``component`` on 1x2 (``extra`` replaces the options it
    sets); returns its stderr."""
    args = without(TINY, "--steps", "--resume", *(a for a in extra if a.startswith("--")))
    proc = torchx_cli("run", "-s", "local_cwd", f"components/{component}.py:{component}",
                      "-j", "1x2", *options, "--", *args, *STEPS, *extra,
                      "--output-dir", str(run_dir))
    assert proc.returncode == 0 and "Job finished: SUCCEEDED" in proc.stderr, proc.stderr[-4000:]
    return proc.stderr


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory) -> Path:
    """The crash tests' run uninterrupted: its 2 ranks forked (the numbers a torchrun launch
    gives; launching and restarting are the crash tests' own subject), shared by them."""
    run_dir = tmp_path_factory.mktemp("ddp") / "reference"
    run_trainer([*without(TINY, "--steps", "--resume"), *STEPS, "--output-dir", str(run_dir)],
                nproc=2)
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("kill, extra, lost", [
    # sync: rank 0 dies inside the step-8 save (shards written, not committed)
    ("0:8:save", ["--no-async-checkpoint"], 4),
    # async: rank 0 dies while committing the step-8 save, after step 9
    ("0:8:save", [], 5),
    # async: rank 1 dies after step 9, while the step-8 save is written and not yet committed
    ("1:9", [], 5),
], ids=["sync-save", "async-commit", "async-in-flight"])
def test_crash_mid_save_leaves_the_previous_checkpoint_and_resumes_from_it(
        tmp_path, ddp_reference, kill, extra, lost):
    """The restart finds step 8 unfinished, resumes from step 4 and ends equal to the
    uninterrupted run. At --log-every 5 the steps up to the kill reach metrics.jsonl by the
    loop's flushes before a kill point and a checkpoint's commit (the reference logs every
    step), so ``steps_lost`` counts them all."""
    extra = [*extra, "--log-every", "5"]
    stderr = run_component("ddp", tmp_path / "faulted", extra, "--max_retries", "1",
                           "--env", f"TRAINERS_KILL_AT={kill}")
    rank, step, *_ = kill.split(":")
    assert f"killing rank {rank} at step {step}" in stderr
    summary = json.loads((tmp_path / "faulted" / "summary.json").read_text())
    assert (summary["restarts"], summary["steps_lost"], summary["resumed_from_step"]) == \
        (1, lost, 4)
    steps = step_dirs(tmp_path / "faulted" / "checkpoints")
    assert steps == find_checkpoints(tmp_path / "faulted")  # no uncommitted step left behind
    assert all(verify(p) is None for p in steps)
    assert_same_run(tmp_path / "faulted", ddp_reference, tmp_path)


@pytest.mark.slow
def test_truncated_newest_checkpoint_is_skipped_with_a_warning(tmp_path):
    args = [*TINY, "--output-dir", str(tmp_path), "--checkpoint-every", "3", "--steps", "6"]
    run_trainer(args)
    reference = losses(tmp_path)
    newest = tmp_path / "checkpoints" / "step_00000006"
    shard = next(newest.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    assert "bytes, expected" in verify(newest)
    args[args.index("none")] = "auto"
    proc = run_trainer(args)
    assert "step_00000006 is corrupt" in proc.stderr and "step_00000003 at step 3" in proc.stdout
    assert losses(tmp_path) == reference


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs: room for one tiny-model checkpoint (3 MiB), not two."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    mount = tmp_path / "disk"
    mount.mkdir()
    run_command(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    yield mount
    run_command(["umount", str(mount)], check=True)


@pytest.mark.slow
@pytest.mark.parametrize("steps", ["8", "10"], ids=["final-sync", "periodic-async"])
def test_disk_full_during_save_is_reported_and_the_previous_checkpoint_survives(small_disk,
                                                                                 steps):
    """Step 8's save fails: the final, synchronous one of 8 steps, or an asynchronous one of
    10 (reported when it is committed, after step 9)."""
    run_dir = small_disk / "run"
    args = [*TINY, "--output-dir", str(run_dir), "--checkpoint-every", "4",
            "--keep-checkpoints", "1", "--steps", steps]
    proc = run_trainer(args, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"trainers.ddp: error: checkpoint step 8 could not be written to {run_dir}/checkpoints "
        "(the file system is full: 0.0 MiB free); step_00000004 is intact and a restart "
        "resumes from it; free space there, lower --keep-checkpoints or pass another "
        "--output-dir")
    assert "Traceback" not in proc.stderr
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_00000004"]
    assert verify(run_dir / "checkpoints" / "step_00000004") is None


@pytest.mark.parametrize("value, expected", [
    ("1:6", KillPoint(1, 6, "step")), ("0:8:save", KillPoint(0, 8, "save")),
    ("3:2:node", KillPoint(3, 2, "node")), ("", None),
])
def test_kill_point_parses(value, expected):
    assert kill_point(value) == expected


@pytest.mark.parametrize("value", ["1", "1:0", "a:3", "1:3:disk", "-1:3"])
def test_kill_point_rejects(value):
    with pytest.raises(ConfigError, match=r"expected RANK:STEP\[:step\|save\|upload\|node\]"):
        kill_point(value)

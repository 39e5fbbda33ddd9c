"""torchft replica groups (``--fault-tolerant``, components/fault_tolerant.py) on local_cwd with
gloo: with every group alive a step is the plain DDP step over all their ranks (losses within
1e-5); a group whose worker is SIGKILLed mid-run restarts alone and heals from the live group's
state while the live one keeps stepping, and the job succeeds; bad input is one line before
anything runs."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torchx.runner import get_runner

import trainers.ddp
from components.errors import ComponentArgumentError
from components.schedulers.torchx_workarounds.releases import dryrun_app
from tests.support.processes import start, unused_port
from tests.support.runs import (
    TINY,
    assert_close,
    final_weights,
    losses,
    one_line_error,
    run_trainer,
    torchx_cli,
    without,
)
from trainers.runs.replica_groups import finished_groups, report_finished

COMPONENT = "components/fault_tolerant.py:fault_tolerant"


def component_command(run_dir: Path, trainer: str, min_replicas: int,
                      trainer_args: list[str]) -> list[str]:
    """``torchx run -s local_cwd`` of 2 replica groups x 2 ranks of ``trainer`` writing to
    ``run_dir``."""
    return [sys.executable, "-m", "torchx.cli.main", "run", "-s", "local_cwd", COMPONENT,
            "--trainer", trainer, "--groups", "2", "--min_replicas", str(min_replicas),
            "-j", "1x2",
            "--lighthouse_port", str(unused_port()), "--", *trainer_args,
            "--output-dir", str(run_dir)]


def records(group_dir: Path) -> list[dict]:
    path = group_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["ddp", "fsdp"])
def test_replica_groups_step_as_the_trainer_over_all_their_ranks(tmp_path, trainer,
                                                                 ddp_two_ranks):
    """2 groups x 2 ranks (min_replicas 2: both in every quorum; FSDP sharded over a group)
    against the plain DDP run of the same global batch (tests/conftest.py's, 2 ranks): every
    step's loss within 1e-5 in both groups' metrics, and the job succeeds once the lighthouse
    sees both groups finish."""
    run_dir = tmp_path / "ft"
    args = [*without(TINY, "--batch-size"), "--batch-size", "16"]
    job = start(component_command(run_dir, trainer, 2, args), label=f"ft-{trainer}")
    proc = job.wait(300)
    assert proc.returncode == 0 and "Job finished: SUCCEEDED" in proc.stderr, \
        job.describe(f"exit {proc.returncode}")
    for group in (0, 1):
        assert_close(losses(run_dir / f"replica_group_{group}"), ddp_two_ranks)


def _worker_pids(module: str, group: int) -> list[int]:
    """The ``module`` processes of replica group ``group`` (not their torchrun, not the
    shell)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in argv if w]
        if (len(words) > 2 and module in words and "--nproc_per_node" not in words
                and "bash" not in Path(words[0]).name
                and any(a == "--replica-group" and b == str(group)
                        for a, b in zip(words, words[1:], strict=False))):
            pids.append(int(entry.name))
    return pids


@pytest.mark.slow
def test_a_killed_replica_group_heals_while_the_other_keeps_stepping(tmp_path):
    """SIGKILL of one FSDP worker of group 1 after its step 10: group 0 never restarts and its
    steps only go forward; group 1 restarts alone (torchrun), heals from group 0's state (each
    rank its shards; its steps jump to group 0's) and ends with parameters equal to group 0's;
    the job SUCCEEDS. (DDP's groups heal the same way on the Slurm cluster:
    tests/system/test_slurm_fault_tolerant.py.)"""
    trainer, total = "fsdp", 250
    args = without(TINY, "--steps", "--log-every", "--train-samples") + [
        "--steps", str(total), "--log-every", "1", "--checkpoint-every", "100",
        "--train-samples", "4096"]
    run_dir = tmp_path / "ft"
    job = start(component_command(run_dir, trainer, 1, args), label="ft-kill")
    deadline = time.monotonic() + 180
    while not any(r["step"] >= 10 for r in records(run_dir / "replica_group_1")):
        assert job.popen.poll() is None and time.monotonic() < deadline, \
            job.describe("group 1 stuck before step 10")
        time.sleep(0.2)
    victims = _worker_pids(f"trainers.{trainer}", 1)
    assert len(victims) == 2, victims
    killed_after = max(r["step"] for r in records(run_dir / "replica_group_1"))
    os.kill(victims[0], signal.SIGKILL)
    proc = job.wait(300)
    assert proc.returncode == 0 and "Job finished: SUCCEEDED" in proc.stderr, \
        job.describe(f"exit {proc.returncode}")

    # The first group up trains alone until the other joins and heals (min_replicas 1), so
    # group 0 may start past step 1; from then on its steps only go forward, one at a time.
    healthy = records(run_dir / "replica_group_0")
    steps = [r["step"] for r in healthy]
    assert steps[0] <= killed_after and steps == list(range(steps[0], total + 1)), \
        "the live group's steps went back or skipped"
    summary = json.loads((run_dir / "replica_group_0" / "summary.json").read_text())
    assert summary["restarts"] == 0 and summary["steps_lost"] == 0, summary

    # Restarted, the group keeps the lines up to the checkpoint it resumed from (none before
    # step 100) and continues at the live group's step: a jump past the steps it missed.
    healed = [r["step"] for r in records(run_dir / "replica_group_1")]
    jumps = [(a, b) for a, b in zip([0, *healed], healed, strict=False) if b - a > 1]
    assert len(jumps) == 1 and jumps[0][1] > killed_after and healed[-1] == total, healed
    summary = json.loads((run_dir / "replica_group_1" / "summary.json").read_text())
    assert summary["restarts"] >= 1, summary

    live, rejoined = (final_weights(run_dir / f"replica_group_{g}", tmp_path) for g in (0, 1))
    assert live.keys() == rejoined.keys()
    for name, tensor in live.items():
        assert torch.equal(rejoined[name], tensor), name


def test_an_unreachable_lighthouse_is_one_line(tmp_path):
    """A trainer whose lighthouse never answers exits within --quorum-timeout, naming how to
    start one or point at it."""
    proc = run_trainer([*TINY, "--fault-tolerant", "--lighthouse",
                        f"http://127.0.0.1:{unused_port()}", "--quorum-timeout", "1",
                        "--output-dir", str(tmp_path / "run")], check=False)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if "lighthouse" in line]
    assert len(lines) == 1 and "cannot reach the torchft lighthouse" in lines[0], proc.stderr
    assert "torchft_lighthouse --min_replicas" in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv, message", [
    (["--fault-tolerant", "--replica-groups", "2", "--min-replicas", "3"],
     "--min-replicas 3 must be between 1 and the 2 replica groups"),
    (["--fault-tolerant", "--replica-group", "2"], "--replica-group 2 is not one of the 2"),
    (["--fault-tolerant", "--lighthouse", "ftp://host"], "is not a lighthouse URL"),
    (["--replica-groups", "3"], "--replica-groups applies only to --fault-tolerant"),
    (["--fault-tolerant", "--batch-size", "6"], "data-parallel size 4 (2 replica groups of 2)"),
], ids=["min-replicas", "group", "url", "without-flag", "batch"])
def test_bad_replica_group_options_are_one_line(capsys, monkeypatch, argv, message):
    monkeypatch.setenv("WORLD_SIZE", "2")
    err = one_line_error(capsys, trainers.ddp, *TINY, *argv)
    assert message in err, err


@pytest.mark.parametrize("args, message", [
    (["--groups", "2", "--min_replicas", "3"], "--min_replicas 3 must be between 1 and the 2"),
    (["--trainer", "pipeline"], "replica groups hold the ddp or fsdp trainer"),
    (["-j", "2x2"], "a replica group is one node here"),
    (["--", "--replica-group", "1"], "--replica-group is set by the component"),
], ids=["min-replicas", "trainer", "nodes", "own-option"])
def test_bad_component_arguments_are_one_line_on_every_entry_point(args, message):
    """The runner's dry run raises the one-line error; ``torchx run`` prints it and exits 1,
    before anything is scheduled."""
    trainer_args = ["--model", "tiny", "--tracker", "none"]
    argv = [*args, "--", *trainer_args] if "--" not in args else [*args, *trainer_args]
    with get_runner() as runner, pytest.raises(ComponentArgumentError) as info:
        runner.dryrun_component(COMPONENT, argv, "local_cwd")
    assert message in str(info.value) and "\n" not in str(info.value)
    proc = torchx_cli("run", "-s", "local_cwd", COMPONENT, *argv)
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr[-2000:]


def test_the_planner_plans_replica_groups_one_a_node_and_its_command_dry_runs(capsys):
    """``plan --fault-tolerant`` sizes one node's group on its share of the batch and prints
    the fault_tolerant component's command, which the component accepts as printed."""
    from trainers.planning import plan

    plan.main(["--model", "tiny", "--device", "cpu", "--devices-per-node", "2",
               "--device-memory-gb", "4", "--nodes", "2", "--global-batch", "8",
               "--fault-tolerant", "--scheduler", "local_cwd"])
    command = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert command[:5] == ["torchx", "run", "-s", "local_cwd", COMPONENT], command
    assert command[5:11] == ["--trainer", "ddp", "--groups", "2", "-j", "1x2"], command
    with get_runner() as runner:
        info = runner.dryrun_component(COMPONENT, command[5:], "local_cwd")
    roles = [role.name for role in dryrun_app(info).roles]
    assert roles == ["lighthouse", "replica_group_0", "replica_group_1"], roles
    with pytest.raises(SystemExit):
        plan.main(["--model", "tiny", "--nodes", "3", "--global-batch", "8",
                   "--fault-tolerant"])
    assert "does not split over 3 replica groups" in capsys.readouterr().err


def test_the_lighthouse_stops_when_every_group_reports_having_finished(tmp_path):
    """Pods share no disk: the groups' reports alone stop the lighthouse (a report of another
    --steps does not count), and it exits 0 for the job to succeed. A group that starts after
    another finished (a restart that came too late to heal) trains nothing: it stops, exit 0,
    saying where the job's model is. So does one that started before the report and finds
    itself alone at its first quorum (the finished group's heartbeats stopped after its report:
    a torchft client heartbeats as group 0 until then, which keeps group 2 out of a quorum of
    its own); its metrics from before (a killed attempt's) stay as they were."""
    port = unused_port(span=2)  # the reports' port is the next one
    lighthouse = start(
        [sys.executable, "-m", "trainers.tools.lighthouse", "--groups", "3", "--steps", "5",
         "--output-dir", str(tmp_path / "elsewhere"), "--port", str(port),
         "--heartbeat-timeout-ms", "2000"])
    url = f"http://localhost:{port}"
    beating = threading.Event()
    beating.set()

    def heartbeat_as_group_0() -> None:
        from torchft._torchft import LighthouseClient

        client = LighthouseClient(url, timedelta(seconds=5))
        while beating.is_set():
            client.heartbeat("replica_group_0:finished")
            time.sleep(0.2)

    def group(index: int, run: str) -> list[str]:
        return [*without(TINY, "--steps", "--batch-size"), "--steps", "5", "--batch-size", "6",
                "--fault-tolerant", "--replica-groups", "3", "--replica-group", str(index),
                "--lighthouse", url,
                "--output-dir", str(tmp_path / run)]

    earlier = tmp_path / "waiting" / "replica_group_2" / "metrics.jsonl"
    earlier.parent.mkdir(parents=True)
    earlier.write_text("".join(json.dumps({"step": s, "loss": 5.0}) + "\n" for s in (1, 2, 3)))
    heart = threading.Thread(target=heartbeat_as_group_0, daemon=True)
    try:
        assert "serving 3 replica groups" in lighthouse.wait_for("lighthouse serving", 60)
        heart.start()
        waiting = start([sys.executable, "-m", "trainers.ddp", *group(2, "waiting")])
        # past its start's check (nothing finished yet): its first quorum waits for group 0
        waiting.wait_for("run directory:", 120)
        assert report_finished(url, 0, 5) and report_finished(url, 1, 4)
        assert finished_groups(url) == [0] and lighthouse.popen.poll() is None
        beating.clear()
        late = run_trainer(group(1, "late"), check=False)
        assert late.returncode == 0, late.stderr[-3000:]
        assert "replica group 1 stops: replica group 0" in late.stdout, late.stdout
        assert "already trained the job's 5 steps" in late.stdout, late.stdout
        assert not (tmp_path / "late" / "replica_group_1" / "metrics.jsonl").exists()
        rest = waiting.wait(120)
        assert rest.returncode == 0 and "replica group 2 stops: replica group 0" in rest.stdout, \
            waiting.describe(f"exit {rest.returncode}")
        assert [json.loads(r)["step"] for r in earlier.read_text().splitlines()] == [1, 2, 3]
        done = lighthouse.wait(30)
    finally:
        beating.clear()
    assert done.returncode == 0 and "every replica group trained 5 steps" in done.stdout, \
        lighthouse.describe(f"exit {done.returncode}")

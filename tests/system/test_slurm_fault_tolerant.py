"""The ``fault_tolerant`` component on the real Slurm cluster of ``.ci/slurm-up``: two replica
groups of one rank, one a node (two heterogeneous components), and the lighthouse as a step on
the first group's node (components/schedulers/slurm/script.py: a component of its own would
need a third node). Group 1's trainer is killed (SIGKILL) mid-run: torchrun restarts it in
place and heals from group 0 (or, had group 0 finished meanwhile, stops: nothing is left to
train or heal from), and group 0 trains on without a restart; the job succeeds once the
lighthouse has stopped."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

from torchx.specs import AppState

from tests.support.slurm import job_dir, run_dir, submit, trainer_args, wait
from tests.system.test_slurm import _trainer_pids

STEPS = 300  # with a line a step (metrics.jsonl is written at each line), group 1 is killed
KILL_AT = 8  # after logging this step, long before the end


def _free_port_pair() -> int:
    """A port P with P and P + 1 free on every interface (the lighthouse and its /finished),
    never 29510 (the default, which other runs on this machine may use)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::", 0))
            port = s.getsockname()[1]
        if port in (29510, 29511) or port >= 65535:
            continue
        try:
            with socket.socket(socket.AF_INET6) as a, socket.socket(socket.AF_INET6) as b:
                a.bind(("::", port))
                b.bind(("::", port + 1))
        except OSError:
            continue
        return port
    raise AssertionError("no two free ports in a row")


def _steps(metrics: Path) -> list[int]:
    if not metrics.exists():
        return []
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines() if line]


def _group_worker(app_id: str, group: int) -> list[int]:
    """The trainer process of replica group ``group`` of Slurm job ``app_id``
    (:func:`tests.system.test_slurm._trainer_pids`, those given ``--replica-group group``)."""
    pids = []
    for pid in _trainer_pids(app_id):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # ended since
        if cmdline[cmdline.index(b"--replica-group") + 1] == str(group).encode():
            pids.append(pid)
    return pids


def test_a_killed_group_heals_while_the_other_keeps_stepping(slurm_cluster, tmp_path):
    port = _free_port_pair()
    handle = submit(tmp_path, "fault_tolerant", "1x1",
                    trainer_args("--tracker", "none", "--checkpoint-every", "0", steps=STEPS,
                                 batch_size=8, log_every=1),
                    "--groups", "2", "--min_replicas", "1", "--lighthouse_port", str(port))
    app_id = handle.rsplit("/", 1)[-1]
    metrics = [run_dir(tmp_path, handle) / f"replica_group_{g}" / "metrics.jsonl"
               for g in range(2)]
    deadline = time.monotonic() + 180
    while not (len(_steps(metrics[1])) >= KILL_AT and _group_worker(app_id, 1)):
        assert time.monotonic() < deadline, f"group 1 did not reach step {KILL_AT} in 180 s"
        time.sleep(0.2)
    for pid in _group_worker(app_id, 1):
        os.kill(pid, signal.SIGKILL)
    killed_after = max(_steps(metrics[1]))
    assert killed_after < STEPS

    assert wait(handle, timeout=300) == AppState.SUCCEEDED
    runs = run_dir(tmp_path, handle)
    summaries = [json.loads(path.read_text()) if path.exists() else {}
                 for path in (runs / f"replica_group_{g}" / "summary.json" for g in range(2))]
    # group 0 never stopped: every step once, in order, and no restart
    assert _steps(metrics[0]) == list(range(1, STEPS + 1))
    assert summaries[0]["restarts"] == 0 and summaries[0]["steps"] == STEPS
    # group 1 was restarted by torchrun: it healed from group 0 at a later step and trained on
    # to the last one, rewriting its metrics from the step it healed at (group 0's state, at
    # least as far as group 1 had logged); or, restarted after group 0 had finished (a tiny
    # model's steps alone are fast), it stopped at once and its metrics are as it left them
    steps = _steps(metrics[1])
    group_log = (job_dir(tmp_path, handle) / f"slurm-{app_id}-replica_group_1-0.out").read_text()
    if "replica group 1 stops: replica group 0 already trained" in group_log:
        assert steps == list(range(1, killed_after + 1)), steps
    else:
        assert summaries[1]["restarts"] == 1 and steps[-1] == STEPS, summaries[1]
        assert steps[0] >= killed_after and steps == list(range(steps[0], STEPS + 1)), steps
    log = (job_dir(tmp_path, handle) / f"slurm-{app_id}-lighthouse-0.out").read_text()
    assert "lighthouse stopped" in log

"""The hyperparameter search (``trainers.tune``): through the tune component under
``torchx run -s local_cwd`` (the job's own local Ray cluster), ASHA stops a diverging learning
rate early and the best trial's learning rate is the good one; on the session's Ray cluster
(tests/support/ray_cluster.py: a head without CPUs, two worker nodes of 2 CPUs), a search whose
driver is killed resumes when its command is run again, and a trial needing more workers than
the cluster holds is refused in one line before anything waits. The refusals that need no
cluster are rows of tests/integration/test_bad_input_commands.py."""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
import time

from tests.support.ray_cluster import RAY_ENV
from tests.support.runs import REPO, TINY, child_env, torchx_cli, without

# Each trial: the tiny model for 20 steps, evaluated every 5 (ASHA's rungs: 5, 10, 20), a
# checkpoint every 5 (what an interrupted trial resumes from).
TRIAL_ARGS = [*without(TINY, "--steps", "--eval-every", "--resume", "--log-every"),
              "--steps", "20", "--eval-every", "5", "--checkpoint-every", "5",
              "--log-every", "5", "--resume", "auto"]
# Learning rates for that run: one too slow, a good one, one that diverges (its loss rises
# from ln 256 = 5.5).
SLOW_LR, GOOD_LR, DIVERGING_LR = "1e-4", "3e-3", "3"


def tune_command(address: str, launcher: list[str], trainer: list[str],
                 workers: int = 1) -> list[str]:
    return [sys.executable, "-m", "trainers.tune", "--trainer", "ddp", "--workers",
            str(workers), "--address", address, *launcher, "--", *trainer]


def run_tune(command: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=REPO, env={**child_env(), **RAY_ENV},
                          capture_output=True, text=True, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout + proc.stderr


def table_rows(stdout: str) -> dict[str, dict[str, str]]:
    """The trials' table that the search prints, by trial (after any prefix a log adds)."""
    lines = [line[line.index("| "):] for line in stdout.splitlines()
             if re.search(r"\| (trial|---|\w+_\d+) \|", line)]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
            for line in lines[2:]]
    return {row["trial"]: row for row in rows}


def test_asha_stops_the_diverging_rate_and_the_best_rate_is_good(tmp_path):
    """The tune component under ``torchx run -s local_cwd``: one job whose local Ray cluster (2
    CPUs) runs three trials one after another (a grid in a fixed order, so each reaches a rung
    after the ones before it): the slow first rate trains to the end, the diverging last one
    is stopped at the first rung, and the best is the good rate. The best configuration's
    torchx command is printed and dry-runs; the plot has every trial."""
    search_dir = tmp_path / "search"
    proc = torchx_cli("run", "-s", "local_cwd", "--wait", "--log", "tune", "--trainer", "ddp",
                      "--search", f"lr=grid:{SLOW_LR},{GOOD_LR},{DIVERGING_LR}", "--trials", "1",
                      "--max_concurrent", "1", "--cpu", "2", "--", *TRIAL_ARGS,
                      "--output-dir", str(search_dir), env=RAY_ENV, timeout=600)
    stdout = _ok(proc)
    rows = table_rows(stdout)
    by_lr = {row["lr"]: row for row in rows.values()}
    assert sorted(by_lr) == sorted([SLOW_LR, GOOD_LR, DIVERGING_LR]), stdout[-3000:]
    assert by_lr[DIVERGING_LR]["outcome"] == "stopped by ASHA at step 5", stdout[-3000:]
    assert float(by_lr[DIVERGING_LR]["eval loss"]) > math.log(256), stdout[-3000:]
    assert by_lr[SLOW_LR]["outcome"] == "completed", stdout[-3000:]
    best = re.search(r"best: (\S+) \(lr=(\S+)\): eval loss ([\d.]+) at step (\d+)$", stdout,
                     re.M)
    assert best and best[2] == GOOD_LR, stdout[-3000:]
    assert float(best[3]) < float(by_lr[SLOW_LR]["eval loss"]), stdout[-3000:]
    assert json.loads((search_dir / "search.json").read_text())["search"] == [
        f"lr=grid:{SLOW_LR},{GOOD_LR},{DIVERGING_LR}"]
    # Each trial trained in its own run directory, checkpoints included.
    for trial, row in rows.items():
        records = [json.loads(line) for line in
                   (search_dir / trial / "run" / "metrics.jsonl").read_text().splitlines()]
        assert records[0]["step"] == 1 and records[-1]["step"] >= int(row["steps"])
    assert (search_dir / best[1] / "run" / "checkpoints").is_dir()
    # The printed command trains the best configuration: torchx accepts it (a dry run).
    command = re.search(r"train it: (torchx run .*)$", stdout, re.M)[1]
    assert f"--lr {best[2]}" in command and "-j 1x1" in command
    dry = subprocess.run([*command.split()[:2], "--dryrun", *command.split()[2:]], cwd=REPO,
                         env=child_env(), capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert (search_dir / "trials.png").stat().st_size > 10_000


def test_a_search_whose_driver_is_killed_resumes_when_run_again(tmp_path, ray_cluster):
    """Two learning rates drawn log-uniformly (seeded), both trials at once. The driver is
    SIGKILLed once a trial has committed a checkpoint (its manifest); the same command then
    resumes the search: the same two trials, the interrupted ones resuming from their
    checkpoints, and every trial ending (completed or stopped by ASHA). A different search on
    the same directory is refused."""
    search_dir = tmp_path / "search"
    command = tune_command(
        ray_cluster.address,
        ["--search", "lr=loguniform:1e-3:1e-2", "--trials", "2", "--seed", "7",
         "--max-concurrent", "2"],
        [*TRIAL_ARGS, "--output-dir", str(search_dir)])
    driver = subprocess.Popen(command, cwd=REPO, env={**child_env(), **RAY_ENV},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not list(search_dir.glob("*/run/checkpoints/step_*/manifest.json")):
        assert driver.poll() is None and time.monotonic() < deadline, driver.stdout.read()[-4000:]
        time.sleep(0.5)
    driver.send_signal(signal.SIGKILL)
    driver.communicate(timeout=60)
    drawn = json.loads((search_dir / "search.json").read_text())
    first_trials = sorted(path.name for path in search_dir.iterdir() if (path / "run").is_dir())

    proc = run_tune(command)
    stdout = _ok(proc)
    assert f"resuming the search in {search_dir}" in stdout
    rows = table_rows(stdout)
    assert len(rows) == 2 and set(first_trials) <= set(rows), stdout
    assert all(row["outcome"] == "completed" or row["outcome"].startswith("stopped by ASHA")
               for row in rows.values()), stdout
    assert all(1e-3 <= float(row["lr"]) <= 1e-2 for row in rows.values()), stdout
    assert "resumed from" in proc.stdout + proc.stderr
    assert json.loads((search_dir / "search.json").read_text()) == drawn

    other = run_tune(tune_command(ray_cluster.address,
                                  ["--search", "lr=loguniform:1e-4:1e-3", "--trials", "2"],
                                  [*TRIAL_ARGS, "--output-dir", str(search_dir)]), timeout=120)
    assert other.returncode == 2, other.stderr[-3000:]
    errors = [line for line in other.stderr.splitlines() if ": error: " in line]
    assert errors == [f"trainers.tune: error: --output-dir {search_dir} holds another search "
                      "(['lr=loguniform:1e-3:1e-2']); pass a new --output-dir, or the same "
                      "options to resume it"], other.stderr[-3000:]


def test_more_workers_per_trial_than_the_cluster_holds_are_refused(tmp_path, ray_cluster):
    start = time.monotonic()
    proc = run_tune(tune_command(ray_cluster.address, ["--search", "lr=choice:1e-3,1e-2"],
                                 [*TRIAL_ARGS, "--batch-size", "20",
                                  "--output-dir", str(tmp_path / "s")], workers=5), timeout=120)
    assert time.monotonic() - start < 60
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith(
        "trainers.tune: error: --workers 5 need 1 CPU each, but the Ray cluster (3 nodes, 4 "
        "CPUs, 0 GPUs) can place only 4; pass --workers 4 or fewer"), proc.stderr[-3000:]
    assert not (tmp_path / "s").exists()


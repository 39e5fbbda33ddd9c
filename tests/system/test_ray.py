"""The trainers under Ray Train (``trainers.on_ray.train``) on a real local Ray cluster.

One cluster serves the session (``ray_cluster``, tests/support/ray_cluster.py): on loopback, a
head without CPUs and two worker nodes of 2 CPUs each (``ray start --block``), started one at a
time before anything here trains and stopped at the end. fsdp with 2 workers must give the
per-step losses of the same config under torchrun, a worker killed mid-run must be restarted by
Ray and end where the uninterrupted run does, so must a run whose node is drained for
preemption (the drained node is replaced afterwards), and bad input must stop the launcher with
one line before anything waits. Without Ray installed these tests skip (and so fail under CI=true).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.ray_cluster import RAY_ENV, RayCluster, free_port, needs_ray
from tests.support.runs import (
    REPO,
    assert_close,
    assert_same_run,
    child_env,
    losses,
    run_trainer,
    without,
)
from tests.unit.test_ray_launcher import ARGS


@pytest.fixture
def ray_address(ray_cluster) -> str:
    return ray_cluster.address


def run_ray(launcher: list[str], trainer: list[str], extra_env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m trainers.on_ray.train LAUNCHER -- TRAINER``; returns the finished process."""
    env = {**child_env(), **RAY_ENV, **(extra_env or {})}
    cmd = [sys.executable, "-m", "trainers.on_ray.train", *launcher, "--", *trainer]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout + proc.stderr


def _one_line_error(proc: subprocess.CompletedProcess[str], returncode: int = 2) -> str:
    """The single error line of a refused (exit 2) or failed launch, checked to be the only
    ``: error:`` line; a refused launch prints no traceback."""
    assert proc.returncode == returncode, \
        f"{proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    if returncode == 2:
        assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, proc.stderr[-4000:]
    assert errors[0].startswith("trainers.on_ray.train: error: "), errors[0]
    return errors[0]


# Trainer options per strategy beyond ARGS.
STRATEGY_ARGS: dict[str, list[str]] = {"ddp": [], "fsdp": []}

# The drain test's run: no periodic checkpoints (the one the workers save on the notice is the
# only one), and long enough that Ray's preemption watcher (polling every second there) sees the
# drain well before the end: it is issued once metrics.jsonl has a line, which the loop
# flushes at an attempt's first step and then every --log-every steps (see _drainer).
DRAIN_ARGS = [*without(ARGS, "--steps", "--checkpoint-every", "--log-every"), "--steps", "100",
              "--checkpoint-every", "0", "--log-every", "50"]

# The uninterrupted torchrun runs (2 ranks) the Ray runs are compared with: trainer module and
# arguments, in the order the tests below read them.
REFERENCES: dict[str, tuple[str, list[str]]] = {
    "fsdp": ("trainers.fsdp", [*ARGS, *STRATEGY_ARGS["fsdp"]]),
    "ddp": ("trainers.ddp", [*ARGS, *STRATEGY_ARGS["ddp"]]),
    "drain": ("trainers.ddp", DRAIN_ARGS),
}

# The reference runs of this session once they are under way (see torchrun_runs).
_references: list[Future] = []


def _no_reference_training() -> None:
    """Wait until no reference run trains: a Ray node must not start beside one."""
    for run in _references:
        run.exception()


@pytest.fixture(scope="module")
def torchrun_runs(tmp_path_factory, ray_cluster) -> Iterator[dict[str, Path]]:
    """Run directories of the REFERENCES, trained one after another in the background from the
    moment this is set up; reading one waits for it. The session's Ray cluster is up before
    (see REGISTRATION_WAIT_S)."""

    def train(name: str, run_dir: Path) -> Path:
        module, args = REFERENCES[name]
        run_trainer([*args, "--output-dir", str(run_dir)], nproc=2, module=module)
        return run_dir

    with ThreadPoolExecutor(1) as pool:
        runs = {name: pool.submit(train, name, tmp_path_factory.mktemp(f"torchrun-{name}"))
                for name in REFERENCES}
        _references.extend(runs.values())

        class Runs(dict):
            def __missing__(self, name: str) -> Path:
                self[name] = runs[name].result()
                return self[name]

        yield Runs()


@pytest.mark.slow
def test_two_fsdp_workers_match_torchrun(tmp_path, torchrun_runs, ray_address, strategy="fsdp"):
    """2 Ray Train workers on the local cluster train exactly as torchrun's 2 ranks do; the
    last report carries step 10's metrics and its DCP checkpoint, where the loop wrote it.
    fsdp stands for the trainers on a device mesh; ddp is compared with torchrun, losses and
    weights, by the killed-worker and drain tests below."""
    run_dir = tmp_path / "ray"
    out = _ok(run_ray(["--trainer", strategy, "--workers", "2", "--address", ray_address],
                      [*ARGS, *STRATEGY_ARGS[strategy], "--output-dir", str(run_dir)]))
    got, expected = losses(run_dir), losses(torchrun_runs[strategy])
    assert_close(got, expected)
    worst = max(abs(got[s] - expected[s]) / abs(expected[s]) for s in expected)
    print(f"{strategy}: Ray vs torchrun, {len(got)} steps, max relative difference {worst:.1e}, "
          f"final loss {got[10]:.6f} vs {expected[10]:.6f}")
    assert f"finished: step 10, loss {got[10]}, checkpoint " \
           f"{run_dir / 'checkpoints' / 'step_00000010'}" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["world_size"], summary["restarts"], summary["resumed_from_step"]) == (2, 0, 0)


@pytest.mark.slow
def test_killed_worker_is_restarted_by_ray_and_resumes(tmp_path, torchrun_runs, ray_address):
    """Rank 1 is SIGKILLed after step 6; Ray (--max-failures 1) restarts the worker group,
    which resumes from the step-4 checkpoint it was handed and ends with the uninterrupted
    run's losses and weights."""
    run_dir = tmp_path / "faulted"
    out = _ok(run_ray(["--trainer", "ddp", "--workers", "2", "--address", ray_address,
                       "--max-failures", "1"], [*ARGS, "--output-dir", str(run_dir)],
                      {"TRAINERS_KILL_AT": "1:6"}))
    assert "killing rank 1 at step 6" in out
    assert f"resumed from {run_dir / 'checkpoints' / 'step_00000004'} at step 4" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["restarts"], summary["steps_lost"], summary["resumed_from_step"]) == (1, 2, 4)
    assert_same_run(run_dir, torchrun_runs["ddp"], tmp_path)


def _drainer(address: str, metrics: Path, after_steps: int) -> subprocess.Popen[str]:
    """A process that drains the Ray node running one of the job's worker actors for preemption
    (deadline 5 s, as a spot node's notice) once ``metrics`` has ``after_steps`` lines, then
    prints ``NODE LINES`` (the node's id, the lines at the drain); 4 minutes at most. It prints
    ``ready`` once it has joined the cluster (start the job after that) and drains through the
    GCS client it holds (what ``ray drain-node`` calls), so the notice follows the step at
    once: a ``ray drain-node`` process started at that step spent most of a 100-step run
    importing Ray on a loaded CI machine, and the run ended before it drained."""
    script = f"""
import time
from pathlib import Path
import ray
from ray.core.generated import autoscaler_pb2
ray.init(address={address!r}, logging_level="ERROR")
gcs = ray._raylet.GcsClient(address={address!r})
print("ready", flush=True)
metrics, deadline = Path({str(metrics)!r}), time.monotonic() + 240
node = None
while time.monotonic() < deadline:
    if node is None:
        node = next((a["Address"]["NodeID"] for a in ray._private.state.actors().values()
                     if a["State"] == "ALIVE" and "RayTrainWorker" in a["ActorClassName"]),
                    None)
    lines = len(metrics.read_text().splitlines()) if metrics.exists() else 0
    if node is not None and lines >= {after_steps}:
        accepted, why = gcs.drain_node(
            node, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
            "spot instance reclaimed", time.time_ns() // 1_000_000 + 5_000)
        assert accepted, f"the drain was refused: {{why}}"
        print(node, lines)
        break
    time.sleep(0.1)
"""
    return subprocess.Popen([sys.executable, "-c", script], cwd=REPO,
                            env={**child_env(), **RAY_ENV}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.fixture
def drainable_cluster(ray_cluster) -> Iterator[RayCluster]:
    """The session's cluster for a test that drains a node; afterwards (once no reference run
    trains) the drained node is replaced by a new one, so the tests after it, in any order,
    find the cluster as it started."""
    yield ray_cluster
    _no_reference_training()
    ray_cluster.restore()


@pytest.mark.slow
def test_drained_node_saves_the_agreed_step_and_ray_resumes_it_elsewhere(
        tmp_path, torchrun_runs, drainable_cluster):
    """Ray's preemption notice (the node hosting the workers is drained, as KubeRay's autoscaler
    does for a reclaimed spot node; 5 s deadline): both workers save the step they agree on
    and wait; at the deadline Ray restarts the group on the other node, charged to its
    preemption budget (so without --max-failures), and the run resumes there with no step
    lost, ending where the uninterrupted run does."""
    reference = torchrun_runs["drain"]
    _no_reference_training()  # nothing trains beside the run, whose timing matters here
    address = drainable_cluster.address
    run_dir = tmp_path / "ray"
    env = {**child_env(), **RAY_ENV, "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1"}
    metrics = run_dir / "metrics.jsonl"
    drainer = _drainer(address, metrics, after_steps=1)
    assert drainer.stdout is not None
    assert drainer.stdout.readline() == "ready\n", drainer.communicate(timeout=60)[1][-4000:]
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainers.on_ray.train", "--trainer", "ddp", "--workers", "2",
         "--address", address, "--", *DRAIN_ARGS, "--output-dir", str(run_dir)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        drained, errors = drainer.communicate(timeout=300)
        assert drained.strip(), f"no worker node drained: {proc.poll()=}\n{errors[-4000:]}"
        drained_at = int(drained.split()[1])
        out, _ = proc.communicate(timeout=300)
    finally:
        for process in (drainer, proc):
            if process.poll() is None:
                process.kill()
                process.wait()
    assert proc.returncode == 0, out[-6000:]
    assert "preempted by SIGTERM after step " in out, \
        f"drained after step {drained_at}, the run ended unpreempted: {out[-4000:]}"
    saved = int(out.split("preempted by SIGTERM after step ")[1].split(":")[0])
    print(f"drained after step {drained_at}, saved step {saved} of 100")
    assert "interrupted by node preemption" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["resumed_from_step"], summary["preempted"]) == (saved, None)
    assert summary["steps_lost"] <= 1
    assert_same_run(run_dir, reference, tmp_path)


@pytest.mark.slow
def test_killed_worker_without_restarts_fails_in_one_line(tmp_path, ray_address):
    """Without --max-failures a lost worker ends the run: exit 1 and one error line, last."""
    run_dir = tmp_path / "run"
    proc = run_ray(["--trainer", "ddp", "--workers", "2", "--address", ray_address],
                   [*ARGS, "--output-dir", str(run_dir)], {"TRAINERS_KILL_AT": "1:2"})
    line = _one_line_error(proc, returncode=1)
    assert proc.stderr.strip().splitlines()[-1] == line
    print(line)
    # Ray reports rank 1's death or, if it sees it first, rank 0's broken collective.
    assert line.startswith("trainers.on_ray.train: error: training failed: rank "), line
    assert line.endswith("pass --max-failures N to have Ray restart the workers from the last "
                         "checkpoint"), line


@pytest.mark.slow
def test_more_workers_than_the_cluster_holds_are_refused_at_once(tmp_path, ray_address):
    """The session's cluster (a head without CPUs, two nodes of 2) holds 4 workers of 1 CPU."""
    start = time.monotonic()
    line = _one_line_error(run_ray(["--trainer", "ddp", "--workers", "5", "--address",
                                    ray_address], [*ARGS, "--batch-size", "20",
                                                   "--output-dir", str(tmp_path)], timeout=120))
    assert time.monotonic() - start < 60
    assert "--workers 5 need 1 CPU each, but the Ray cluster (3 nodes, 4 CPUs, 0 GPUs) can " \
           "place only 4; pass --workers 4 or fewer" in line
    line = _one_line_error(run_ray(["--trainer", "ddp", "--workers", "2", "--gpus-per-worker",
                                    "1", "--address", ray_address],
                                   [*ARGS, "--output-dir", str(tmp_path)], timeout=120))
    assert "need 1 CPU and 1 GPU each" in line and "can place only 0" in line


@pytest.mark.slow
def test_local_cluster_is_started_and_checked_without_an_address(tmp_path):
    """Without --address the launcher starts its own cluster (1 CPU here), which cannot hold
    2 workers: refused in one line, and the cluster is gone afterwards."""
    needs_ray()
    _no_reference_training()  # the launcher's node registers as the session's did
    line = _one_line_error(run_ray(["--trainer", "fsdp", "--workers", "2", "--num-cpus", "1"],
                                   [*ARGS, "--output-dir", str(tmp_path)], timeout=120))
    assert "(1 node, 1 CPU, 0 GPUs) can place only 1" in line


def test_an_address_without_a_cluster_is_refused(tmp_path):
    needs_ray()
    port = free_port()
    line = _one_line_error(run_ray(["--trainer", "ddp", "--workers", "2", "--address",
                                    f"127.0.0.1:{port}"], [*ARGS, "--output-dir", str(tmp_path)],
                                   timeout=60))
    assert line == (f"trainers.on_ray.train: error: --address 127.0.0.1:{port}: no Ray cluster "
                    "answers there (Connection refused); start one with `ray start --head "
                    f"--port {port}`, pass its head's address, or drop --address to start a "
                    "local cluster")


def test_an_address_with_something_else_behind_it_is_refused(tmp_path):
    """An HTTP server (say, the dashboard's port) is not taken for a Ray head."""
    needs_ray()
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                               str(port := free_port())], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        line = _one_line_error(run_ray(["--trainer", "ddp", "--workers", "2", "--address",
                                        f"127.0.0.1:{port}"],
                                       [*ARGS, "--output-dir", str(tmp_path / "run")],
                                       timeout=60))
    finally:
        server.terminate()
        server.wait()
    assert f"--address 127.0.0.1:{port}: the service there is not a Ray cluster" in line

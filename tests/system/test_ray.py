"""The trainers under Ray Train (``trainers.ray_train``) on a real local Ray cluster.

A head node is started on loopback with 2 CPUs for this module (``ray start --head --block``,
stopped after); fsdp with 2 workers must give the per-step losses of the same config under
torchrun, a worker killed mid-run must be restarted by Ray and end where the uninterrupted run
does, so must a run whose node is drained for preemption (on a cluster of its own), and bad
input must stop the launcher with one line before anything waits. Without Ray installed these
tests skip (and so fail under CI=true).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

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

# Ray 2.60 turns on token authentication for new local clusters and otherwise keeps the token in
# ~/.ray/auth_token, shared by every cluster of this user: the tests' clusters and launchers get
# a token of their own through the environment instead.
RAY_ENV = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def _needs_ray() -> None:
    pytest.importorskip("ray.train", reason="Ray Train is not installed; "
                        "pip install -e '.[ray]' -c constraints/cpu.txt")


def _free_port() -> int:
    """A free port outside the ones a Ray head claims for itself (52365: its agent's)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port != 52365 and not 10001 <= port <= 19999:
            return port


# A node's SIGTERM handler first drains the node, for up to 30 s by default; these nodes stop at
# once.
NODE_ENV = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}


class RayNode:
    """One ``ray start --block`` node on 127.0.0.1 (a head, or a worker joining ``address``),
    launched when constructed, up once :meth:`started` returns, stopped by :meth:`stop`."""

    def __init__(self, *options: str) -> None:
        ray_cli = Path(sys.executable).parent / "ray"
        self.proc = subprocess.Popen(
            [str(ray_cli), "start", "--block", "--node-ip-address=127.0.0.1", "--num-gpus=0",
             "--disable-usage-stats", "--object-store-memory=100000000", *options],
            cwd=REPO, env={**child_env(), **RAY_ENV, **NODE_ENV},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def started(self) -> None:
        """Wait until the node says it is up (2 minutes at most); raise with its output if not."""
        output: list[str] = []
        deadline = time.monotonic() + 120
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            output.append(line)
            if "Ray runtime started" in line or time.monotonic() > deadline:
                break
        if self.proc.poll() is not None or "Ray runtime started" not in "".join(output):
            self.proc.kill()
            raise AssertionError("ray start failed:\n" + "".join(output[-40:]))
        threading.Thread(target=lambda: [output.append(x) for x in self.proc.stdout],
                         daemon=True).start()

    def stop(self) -> None:
        """Ask the node to stop its processes and exit. SIGTERM runs the handler Ray installs
        itself (with NODE_ENV, no drain first); SIGINT relies on Python's default handler, which
        a process started with SIGINT ignored never gets (a module teardown in CI waited out
        :meth:`wait`'s 60 s)."""
        self.proc.send_signal(signal.SIGTERM)

    def wait(self) -> None:
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def ray_cluster(head_cpus: int, worker_cpus: tuple[int, ...] = ()) -> Iterator[str]:
    """A Ray cluster on 127.0.0.1: a head with ``head_cpus`` CPUs and a worker node per entry
    of ``worker_cpus``; its address."""
    _needs_ray()
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths
    nodes = [RayNode("--head", f"--port={port}", f"--num-cpus={head_cpus}",
                     "--include-dashboard=false", f"--temp-dir={temp}")]
    try:
        nodes[0].started()
        # One node at a time: `ray start` gives a raylet a fixed 30 s to register with the head,
        # which two nodes starting side by side on a loaded 2-core machine overran in CI.
        for cpus in worker_cpus:
            nodes.append(RayNode(f"--address=127.0.0.1:{port}", f"--num-cpus={cpus}"))
            nodes[-1].started()
        yield f"127.0.0.1:{port}"
    finally:
        for node in reversed(nodes):
            node.stop()
        for node in nodes:
            node.wait()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A Ray head node on 127.0.0.1 with 2 CPUs and no GPU, for this module; its address."""
    with ray_cluster(2) as address:
        yield address


def run_ray(launcher: list[str], trainer: list[str], extra_env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m trainers.ray_train LAUNCHER -- TRAINER``; returns the finished process."""
    env = {**child_env(), **RAY_ENV, **(extra_env or {})}
    cmd = [sys.executable, "-m", "trainers.ray_train", *launcher, "--", *trainer]
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
    assert errors[0].startswith("trainers.ray_train: error: "), errors[0]
    return errors[0]


@pytest.fixture(scope="module")
def torchrun_runs(tmp_path_factory, ray_address) -> Iterator[dict[str, Path]]:
    """Run directories of ARGS under torchrun on 2 ranks, one per strategy of STRATEGY_ARGS,
    trained one after another in the background from the moment this is set up; reading one
    waits for it. The Ray head starts first: `ray start` gives its raylet a fixed 30 s to
    register, which training beside it on 2 cores could overrun."""

    def train(strategy: str, run_dir: Path) -> Path:
        run_trainer([*ARGS, *STRATEGY_ARGS[strategy], "--output-dir", str(run_dir)], nproc=2,
                    module=f"trainers.{strategy}")
        return run_dir

    with ThreadPoolExecutor(1) as pool:
        runs = {strategy: pool.submit(train, strategy,
                                      tmp_path_factory.mktemp(f"torchrun-{strategy}"))
                for strategy in STRATEGY_ARGS}

        class Runs(dict):
            def __missing__(self, strategy: str) -> Path:
                self[strategy] = runs[strategy].result()
                return self[strategy]

        yield Runs()


# Trainer options per strategy beyond ARGS.
STRATEGY_ARGS: dict[str, list[str]] = {"ddp": [], "fsdp": []}


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


# Long enough that Ray's preemption watcher (polling every second here) sees the drain while
# the run is still going.
DRAIN_ARGS = [*without(ARGS, "--steps", "--checkpoint-every", "--log-every"), "--steps", "100",
              "--checkpoint-every", "0", "--log-every", "50"]


def _node_of_a_worker(address: str) -> str:
    """The id of a Ray node running one of the job's worker actors."""
    script = (f"import ray; ray.init(address={address!r}, logging_level='ERROR'); "
              "print(next(a['Address']['NodeID'] for a in ray._private.state.actors().values() "
              "if a['State'] == 'ALIVE' and 'RayTrainWorker' in a['ActorClassName']))")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env={**child_env(), **RAY_ENV},
                          capture_output=True, text=True, timeout=120, check=True)
    return proc.stdout.split()[-1]


@pytest.mark.slow
def test_drained_node_saves_the_agreed_step_and_ray_resumes_it_elsewhere(tmp_path):
    """Ray's preemption notice (the node hosting the workers is drained, as KubeRay's autoscaler
    does for a reclaimed spot node; 5 s deadline): both workers save the step they agree on
    and wait; at the deadline Ray restarts the group on the other node, charged to its
    preemption budget (so without --max-failures), and the run resumes there with no step
    lost, ending where the uninterrupted run does."""
    reference = tmp_path / "torchrun"
    run_dir = tmp_path / "ray"
    env = {**child_env(), **RAY_ENV, "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1"}
    # The uninterrupted run trains before the cluster starts, not beside it: a Ray node that
    # cannot register within `ray start`'s fixed 30 s fails to start.
    run_trainer([*DRAIN_ARGS, "--output-dir", str(reference)], nproc=2)
    with ray_cluster(0, (2, 2)) as address:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainers.ray_train", "--trainer", "ddp", "--workers", "2",
             "--address", address, "--", *DRAIN_ARGS, "--output-dir", str(run_dir)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        metrics = run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 240
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 10):
            assert proc.poll() is None and time.monotonic() < deadline, "no step 10"
            time.sleep(0.2)
        node = _node_of_a_worker(address)
        subprocess.run([str(Path(sys.executable).parent / "ray"), "drain-node", "--address",
                        address, "--node-id", node, "--reason", "DRAIN_NODE_REASON_PREEMPTION",
                        "--reason-message", "spot instance reclaimed",
                        "--deadline-remaining-seconds", "5"],
                       cwd=REPO, env=env, check=True, capture_output=True, timeout=60)
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-6000:]
    saved = int(out.split("preempted by SIGTERM after step ")[1].split(":")[0])
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
    assert line.startswith("trainers.ray_train: error: training failed: rank "), line
    assert line.endswith("pass --max-failures N to have Ray restart the workers from the last "
                         "checkpoint"), line


@pytest.mark.slow
def test_more_workers_than_the_cluster_holds_are_refused_at_once(tmp_path, ray_address):
    start = time.monotonic()
    line = _one_line_error(run_ray(["--trainer", "ddp", "--workers", "3", "--address",
                                    ray_address], [*ARGS, "--batch-size", "24",
                                                   "--output-dir", str(tmp_path)], timeout=120))
    assert time.monotonic() - start < 60
    assert "--workers 3 need 1 CPU each, but the Ray cluster (1 node, 2 CPUs, 0 GPUs) can " \
           "place only 2; pass --workers 2 or fewer" in line
    line = _one_line_error(run_ray(["--trainer", "ddp", "--workers", "2", "--gpus-per-worker",
                                    "1", "--address", ray_address],
                                   [*ARGS, "--output-dir", str(tmp_path)], timeout=120))
    assert "need 1 CPU and 1 GPU each" in line and "can place only 0" in line


@pytest.mark.slow
def test_local_cluster_is_started_and_checked_without_an_address(tmp_path):
    """Without --address the launcher starts its own cluster (1 CPU here), which cannot hold
    2 workers: refused in one line, and the cluster is gone afterwards."""
    _needs_ray()
    line = _one_line_error(run_ray(["--trainer", "fsdp", "--workers", "2", "--num-cpus", "1"],
                                   [*ARGS, "--output-dir", str(tmp_path)], timeout=120))
    assert "(1 node, 1 CPU, 0 GPUs) can place only 1" in line


def test_an_address_without_a_cluster_is_refused(tmp_path):
    _needs_ray()
    port = _free_port()
    line = _one_line_error(run_ray(["--trainer", "ddp", "--workers", "2", "--address",
                                    f"127.0.0.1:{port}"], [*ARGS, "--output-dir", str(tmp_path)],
                                   timeout=60))
    assert line == (f"trainers.ray_train: error: --address 127.0.0.1:{port}: no Ray cluster "
                    "answers there (Connection refused); start one with `ray start --head "
                    f"--port {port}`, pass its head's address, or drop --address to start a "
                    "local cluster")


def test_an_address_with_something_else_behind_it_is_refused(tmp_path):
    """An HTTP server (say, the dashboard's port) is not taken for a Ray head."""
    _needs_ray()
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                               str(port := _free_port())], cwd=tmp_path,
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

"""The system tier's Ray cluster (:class:`RayCluster`): on loopback, a head without CPUs and
two worker nodes of 2 CPUs each (``ray start --block``), started one at a time, shared by every
test of the session through the ``ray_cluster`` fixture (tests/system/conftest.py)."""

from __future__ import annotations

import json
import re
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
from pathlib import Path

import pytest

from tests.support.runs import REPO, child_env

# How long a starting Ray node may take to register with the GCS. What it waits for (Ray 2.60):
# `ray start` launches the node's raylet, which starts two Python agents (dashboard agent,
# runtime-env agent) and waits for the port files they write once they have imported and bound
# (NodeManager::WaitForDashboardAgentPorts and ::WaitForRuntimeEnvAgentPort; about 15 s, fixed,
# after which the raylet aborts with "Timed out waiting for file .../metrics_agent_port_...")
# before it registers. Meanwhile `ray start` asks the GCS for the node (ray/_private/node.py,
# the loop after `raylet_start_wait_time_s = 30`) with ray._private.services.get_node, which
# blocks in the C++ GlobalStateAccessor::GetNode for up to RayConfig raylet_start_wait_time_s
# (read by every Ray process from RAY_raylet_start_wait_time_s; 30 s unset); node.py checks its
# own fixed 30 s only when such a call comes back empty. The agents' imports are what a loaded
# 2-core machine slows down, so here no node starts while this module trains, nodes start one
# at a time, and the GCS wait is raised for every Ray process these tests start (nodes, and
# launchers: their local cluster and their driver's join wait on it too).
REGISTRATION_WAIT_S = 120

# Ray 2.60 turns on token authentication for new local clusters and otherwise keeps the token in
# ~/.ray/auth_token, shared by every cluster of this user: the tests' clusters and launchers get
# a token of their own through the environment instead. Ray starts its workers (trials, Ray
# Train's workers) at nice 15 (RayConfig worker_niceness): where nice holds across sessions
# (the kernel's scheduler autogroups off) they get only what every other test's processes
# leave (a Tune search took 429 s so instead of 125 s); they run at the tests' own priority.
RAY_ENV = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "RAY_raylet_start_wait_time_s": str(REGISTRATION_WAIT_S), "RAY_worker_niceness": "0"}


def needs_ray() -> None:
    pytest.importorskip("ray.train", reason="Ray Train is not installed; "
                        "pip install -e '.[ray]' -c constraints/cpu.txt")


def free_port() -> int:
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
    """One ``ray start --block`` node on 127.0.0.1 named ``name`` (a head, or a worker joining
    an ``--address``), launched when constructed, up once :meth:`started` returns, stopped by
    :meth:`stop`."""

    def __init__(self, name: str, *options: str) -> None:
        ray_cli = Path(sys.executable).parent / "ray"
        self.name = name
        self.proc = subprocess.Popen(
            [str(ray_cli), "start", "--block", "--node-ip-address=127.0.0.1", "--num-gpus=0",
             "--disable-usage-stats", "--object-store-memory=100000000", f"--node-name={name}",
             *options],
            cwd=REPO, env={**child_env(), **RAY_ENV, **NODE_ENV},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.output: list[str] = []
        self.up = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if "Ray runtime started" in line:  # printed once the GCS lists the node
                self.up.set()

    def started(self, temp: Path) -> None:
        """Wait until the node says it is up, for up to the registration wait and a minute
        more; if it does not, kill it and raise with its output and its raylets' errors (from
        the logs under ``temp``)."""
        deadline = time.monotonic() + REGISTRATION_WAIT_S + 60
        while not self.up.wait(timeout=1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()  # its reaper stops the processes it started
                raise AssertionError(f"ray start of {self.name} failed:\n"
                                     + "".join(self.output[-40:]) + _raylet_errors(temp))

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


def _raylet_errors(temp: Path) -> str:
    """The last error and fatal lines of the raylets' logs under ``temp``."""
    lines = [line for log in sorted(temp.glob("session_*/logs/raylet*.out"))
             for line in log.read_text(errors="replace").splitlines()
             if re.match(r"\[\S+ \S+ [EC] ", line)]
    return "\nraylet errors:\n" + "\n".join(lines[-10:]) if lines else ""


# The session cluster's worker nodes and their CPUs: a 2-worker job fits on one node, and
# another node is left to move it to when that one is drained.
WORKER_NODES, WORKER_CPUS = 2, 2


class RayCluster:
    """The session's Ray cluster on 127.0.0.1: a head with no CPUs (no worker runs there, so
    it is never drained) and WORKER_NODES worker nodes of WORKER_CPUS CPUs, each node started
    once the one before is up (their raylets' agents would compete for the CPUs otherwise)."""

    def __init__(self) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self.temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: socket paths
        self.nodes: dict[str, RayNode] = {}
        self.workers_started = 0

    def start(self) -> None:
        self._start("head", "--head", f"--port={self.address.split(':')[1]}", "--num-cpus=0",
                    "--include-dashboard=false", f"--temp-dir={self.temp}")
        self.restore()

    def _start(self, name: str, *options: str) -> None:
        self.nodes[name] = RayNode(name, *options)
        self.nodes[name].started(self.temp)

    def table(self, wait: bool) -> list[dict]:
        """The cluster's nodes as the GCS lists them (name, alive, draining, CPUs); with
        ``wait``, once exactly this cluster's nodes are alive and none is draining (2 minutes
        at most)."""
        script = f"""
import json, time, ray
ray.init(address={self.address!r}, logging_level="ERROR")
deadline = time.monotonic() + 120
while True:
    draining = ray._private.state.state.get_draining_nodes()
    table = [{{"name": n["NodeName"], "alive": n["Alive"], "draining": n["NodeID"] in draining,
               "cpus": n["Resources"].get("CPU", 0)}} for n in ray.nodes()]
    ready = sorted(n["name"] for n in table if n["alive"] and not n["draining"])
    if not {wait} or ready == {sorted(self.nodes)!r} or time.monotonic() > deadline:
        break
    time.sleep(0.5)
print(json.dumps(table))
"""
        proc = subprocess.run([sys.executable, "-c", script], cwd=REPO,
                              env={**child_env(), **RAY_ENV}, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(proc.stdout.splitlines()[-1])

    def restore(self) -> None:
        """Stop the worker nodes that are gone or draining, start new ones until there are
        WORKER_NODES, and wait until the GCS lists exactly these nodes, alive and not
        draining. Call it only while nothing of this module trains."""
        if self.workers_started:
            healthy = {n["name"] for n in self.table(wait=False)
                       if n["alive"] and not n["draining"]}
            for name in [n for n in self.nodes if n != "head" and n not in healthy]:
                self.nodes[name].stop()
                self.nodes.pop(name).wait()
        while len(self.nodes) < 1 + WORKER_NODES:
            self.workers_started += 1
            self._start(f"worker-{self.workers_started}", f"--address={self.address}",
                        f"--num-cpus={WORKER_CPUS}")
        table = self.table(wait=True)
        alive = sorted((n["name"], n["cpus"]) for n in table if n["alive"] and not n["draining"])
        assert alive == sorted((name, 0 if name == "head" else WORKER_CPUS)
                               for name in self.nodes), table

    def stop(self) -> None:
        for node in reversed(self.nodes.values()):
            node.stop()
        for node in self.nodes.values():
            node.wait()
        shutil.rmtree(self.temp, ignore_errors=True)


def session_cluster() -> Iterator[RayCluster]:
    """The session's Ray cluster (:class:`RayCluster`), up before anything here trains."""
    needs_ray()
    cluster = RayCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()

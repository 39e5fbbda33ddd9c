"""Jobs started at the same moment do not interfere: two single-node and two multi-node
``local_cwd`` jobs on this host, each succeed in a run directory of its own (two two-node jobs
at once on the Slurm cluster: tests/system/test_slurm.py).

No job passes ``--output-dir``: each writes to its default ``outputs/<app id>``, so distinct,
complete run directories show that concurrent jobs do not clobber each other's outputs. The
multi-node jobs rendezvous on a port of their own (``rdzv_port`` 0 picks a free one), not on a
fixed port that every job on the host shares: each job's agents log their endpoint
(``LOGLEVEL=INFO``), and every store connection a job reports names its own port.

torchrun's exit barrier may log a store error in a job of its own: the agent that hosts the
store leaves once the barrier is complete, sometimes before the other agent's wait returns
(torch 2.x, any multi-node job; the job still succeeds). Only a foreign port is a failure here.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from components.launch import RENDEZVOUS_PORTS
from tests.support.runs import REPO
from tests.support.slurm import torchx, trainer_args

STEPS = 20
# The endpoint torchrun's agents log at start, and the peer of a store connection in an error.
ENDPOINT = re.compile(r"rdzv_endpoint\s*:\s*\S+:(\d+)")
STORE_PEER = re.compile(r"remote=\[[^\]]*\]:(\d+)")


def component(name: str) -> str:
    """``components/<name>.py:<name>`` by absolute path (the jobs run outside the repository)."""
    return f"{REPO / 'components' / name}.py:{name}"


def run_local(cwd: Path, name: str, j: str) -> tuple[str, str, str]:
    """``torchx run -s local_cwd`` of component ``name`` at ``-j j`` in ``cwd`` with the
    agents logging at INFO, asserting it succeeded; its (component, app id, stderr)."""
    proc = torchx("run", "-s", "local_cwd", component(name), "-j", j, "--",
                  *trainer_args(steps=STEPS), cwd=cwd, env={"LOGLEVEL": "INFO"}, timeout=600)
    assert "Job finished: SUCCEEDED" in proc.stderr, proc.stderr[-4000:]
    handle = re.search(r"^local_cwd://torchx/(\S+)$", proc.stdout, re.M)
    assert handle, proc.stdout
    return name, handle.group(1), proc.stderr


def run_concurrently(cwd: Path, jobs: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """:func:`run_local` of every (component, -j) in ``jobs``, all started at once."""
    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(lambda job: run_local(cwd, *job), jobs))


def assert_complete(run: Path, world_size: int) -> None:
    """``run`` holds a finished run of STEPS steps at ``world_size`` ranks and its checkpoint."""
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["steps"], summary["world_size"]) == (STEPS, world_size), summary
    assert summary["final_loss"] < summary["first_loss"]
    assert (run / "checkpoints" / f"step_{STEPS:08d}" / "manifest.json").is_file()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == STEPS


def assert_separate_runs(cwd: Path, results: list[tuple[str, str, str]], world_size: int) -> None:
    """One run directory per job under ``cwd/outputs``, each complete, and no other."""
    app_ids = [app_id for _, app_id, _ in results]
    assert len(set(app_ids)) == len(app_ids)
    assert {p.name for p in (cwd / "outputs").iterdir()} == set(app_ids)
    for name, app_id, _ in results:
        assert app_id.startswith(f"{name}-")
        assert_complete(cwd / "outputs" / app_id, world_size)


@pytest.mark.slow
def test_single_and_multi_node_jobs_at_once_on_one_host(tmp_path):
    """Two single-node and two two-node jobs started together: each its own run directory, and
    each two-node job its own rendezvous port (local_cwd runs both "nodes" of a job here: on
    one fixed port the second job's agents would join the first job's store and fail when the
    first job exits)."""
    results = run_concurrently(tmp_path, [("ddp", "1x2"), ("fsdp", "1x2"),
                                          ("ddp", "2x1"), ("fsdp", "2x1")])
    assert_separate_runs(tmp_path, results, world_size=2)
    ports = []
    for _, _, stderr in results[2:]:
        endpoints = set(ENDPOINT.findall(stderr))
        assert len(endpoints) == 1, stderr[-4000:]
        (port,) = endpoints
        assert set(STORE_PEER.findall(stderr)) <= {port}, stderr[-4000:]
        ports.append(port)
    assert len(set(ports)) == len(ports), ports


def rendezvous_port(*options: str) -> int:
    """The rendezvous port of a two-node ddp job as ``torchx run --dryrun`` renders it."""
    proc = torchx("run", "--dryrun", "-s", "local_cwd", component("ddp"), "-j", "2x1",
                  *options, "--", "--model", "tiny", cwd=REPO)
    (port,) = set(re.findall(r"\$\{TORCHX_RANK0_HOST:=localhost\}:(\d+)", proc.stdout))
    return int(port)


def test_multi_node_jobs_get_distinct_rendezvous_ports_unless_one_is_given():
    """Picked ports lie below the ephemeral range, where no process's bind(0) or outgoing
    connection can take them before the job starts."""
    ports = {rendezvous_port() for _ in range(3)}
    assert len(ports) == 3 and ports <= set(RENDEZVOUS_PORTS), ports
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if ephemeral.exists():
        low = int(ephemeral.read_text().split()[0])
        assert max(ports) < low, (ports, low)
    assert rendezvous_port("--rdzv_port", "29600") == 29600

"""A CPU job's memory pre-flight (components/cpu_memory.py) through TorchX's Python runner: on
local_cwd it is priced against this host's available memory, where the node's request is not
enforced, so a small job of many processes that the default 4096 MB request would refuse runs;
on Kubernetes (and Slurm), which enforce the request, the same job is refused in one line before
anything is submitted (as it was by the component)."""

from __future__ import annotations

import json

import pytest
from torchx import specs
from torchx.runner import get_runner

from components.cpu_memory import (
    CPU_MEMORY,
    CpuMemory,
    TrainerRole,
    check_cpu_memory,
    enforces_request,
    host_available_bytes,
    note_cpu_memory,
)
from components.errors import ComponentArgumentError
from components.schedulers.torchx_workarounds.releases import dryrun_app
from tests.support.runs import REPO

PIPELINE = f"{REPO}/components/pipeline.py:pipeline"
# 8 processes of a small 3-D job: 0.50 GiB each by the planner, over 4096 MB / 8 (0.45 usable)
SMALL_3D = ["-j", "1x8", "--", "--model", "llama-tiny", "--pp", "2", "--tp", "2"]
REFUSAL = ("trainers.pipeline: --model llama-tiny needs 0.50 GiB per rank, devices have 0.50 "
           "(0.45 usable);")


def _dryrun(scheduler: str, args: list[str], cfg: dict[str, object]) -> specs.AppDef:
    with get_runner() as runner:
        info = runner.dryrun_component(PIPELINE, args, scheduler, cfg=cfg, workspace=None)
    app = dryrun_app(info)
    assert app is not None
    return app


def test_local_cwd_prices_a_cpu_job_against_the_host_not_the_request():
    app = _dryrun("local_cwd", SMALL_3D, {})
    (role,) = app.roles
    memory = CpuMemory(**json.loads(role.metadata[CPU_MEMORY]))
    assert memory.request_refusal is not None and memory.request_refusal.startswith(REFUSAL)
    assert memory.ranks_per_node == 8 and memory.rank_bytes * 8 < host_available_bytes()


# Slurm's dry run asks its controller first; its refusal of the same job is the Slurm bad-input
# row cpu-job-names-memmb (tests/system/test_bad_input_slurm.py, on the cluster).
@pytest.mark.parametrize(("scheduler", "cfg"), [("kubernetes", {"queue": "q"}),
                                                ("kubernetes_jobset", {"local_queue": "q"})])
def test_schedulers_that_enforce_the_request_refuse_it(scheduler, cfg):
    with pytest.raises(ComponentArgumentError) as refused:
        _dryrun(scheduler, SMALL_3D, cfg)
    message = str(refused.value)
    assert message.startswith(REFUSAL) and "\n" not in message
    assert message.endswith("; or pass more --memMB (now 4096 MB per node, shared by 8 "
                            "processes)")
    _dryrun(scheduler, [*SMALL_3D[:2], "--memMB", "8192", *SMALL_3D[2:]], cfg)  # it fits


def _role(mem_mb: int, replicas: int, rank_bytes: int) -> specs.Role:
    role = TrainerRole(name="ddp", image="", resource=specs.Resource(cpu=2, gpu=0,
                                                                     memMB=mem_mb),
                       num_replicas=replicas)
    note_cpu_memory(role, CpuMemory("ddp", "tiny", rank_bytes, 4, "trainers.ddp: refused"))
    return role


def test_local_docker_enforces_only_a_positive_limit_and_counts_every_node():
    assert not enforces_request("local", _role(4096, 1, 1))
    assert enforces_request("docker", _role(4096, 1, 1))
    assert not enforces_request("docker", _role(0, 1, 1))
    with pytest.raises(ComponentArgumentError, match="^trainers.ddp: refused$"):
        check_cpu_memory("docker", _role(4096, 1, 1))
    check_cpu_memory("docker", _role(0, 1, 1))
    # a local job's nodes all run on this host: 2 nodes x 4 ranks, each an eighth of it
    share = host_available_bytes() // 8
    check_cpu_memory("local", _role(4096, 1, share))
    with pytest.raises(ComponentArgumentError, match="for the job's 8 processes on this host"):
        check_cpu_memory("local", _role(4096, 2, share))

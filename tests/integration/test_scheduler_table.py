"""The schedulers the package installs: TorchX's table with ours in it, local_cwd as the
default wherever ``torchx run`` starts, strict run options, and local_cwd from a virtual
environment that is not activated."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from torchx.schedulers import DEFAULT_SCHEDULER_MODULES, get_scheduler_factories

from components.errors import ComponentArgumentError
from components.schedulers.k8s.jobset import KubernetesJobSetScheduler
from components.schedulers.k8s.volcano import KubernetesScheduler
from components.schedulers.local.cwd import LocalCwdScheduler
from components.schedulers.local.docker_engine import DockerScheduler
from components.schedulers.slurm import ExtendedSlurmScheduler
from components.schedulers.torchx_workarounds import builtin_schedulers
from tests.support.processes import run_command
from tests.support.runs import REPO, losses, torchx_cli

OURS = {"local_cwd": LocalCwdScheduler, "local_docker": DockerScheduler,
        "slurm": ExtendedSlurmScheduler, "kubernetes": KubernetesScheduler,
        "kubernetes_jobset": KubernetesJobSetScheduler}


def test_the_table_is_torchxs_with_ours_in_place_of_its_own():
    factories = get_scheduler_factories()
    assert set(factories) == set(DEFAULT_SCHEDULER_MODULES) | set(OURS) | set(
        builtin_schedulers.MODULES)
    for name, cls in OURS.items():
        assert type(factories[name]("test")) is cls
    for name, module in builtin_schedulers.MODULES.items():
        if name in DEFAULT_SCHEDULER_MODULES:  # this TorchX still has it: TorchX's own class
            if name in ("lsf", "kubernetes_mcad"):  # no extra dependency to create one
                assert type(factories[name]("test")).__module__ == module
        else:
            with pytest.raises(ModuleNotFoundError, match="use torchx==0.7.0"):
                factories[name]("test")


@pytest.mark.parametrize("where", ["outside", "subfolder"])
def test_a_dry_run_without_s_uses_local_cwd(tmp_path, where):
    cwd = tmp_path if where == "outside" else REPO / "docs"
    proc = torchx_cli("run", "--dryrun", f"{REPO}/components/ddp.py:ddp", "-j", "1x1", "--",
                      "--model", "tiny", "--steps", "2", "--output-dir", str(tmp_path / "out"),
                      cwd=cwd, env={"HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "local_cwd://torchx/" in proc.stdout


def test_a_configured_scheduler_stays_the_default(tmp_path):
    """``[cli:run] scheduler`` of a .torchxconfig still chooses: here kubernetes, which then
    asks for its queue."""
    (tmp_path / ".torchxconfig").write_text("[cli:run]\nscheduler = kubernetes\n")
    proc = torchx_cli("run", "--dryrun", "--workspace", "", f"{REPO}/components/ddp.py:ddp",
                      "--", "--model", "tiny", cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1].startswith(" kubernetes: no Volcano queue given")


@pytest.mark.parametrize("scheduler,cfg,message", [
    ("slurm", "partiton=gpu", "slurm: -cfg partiton=gpu: slurm has no run option partiton; did "
     "you mean partition?"),
    ("kubernetes", "namepsace=team-a", "did you mean namespace?"),
    ("local_cwd", "foo=bar", "local_cwd has no run option foo; pass one of "
     "auto_set_cuda_visible_devices, log_dir, prepend_cwd"),
    ("local_docker", "copy_envs=HOME", "did you mean copy_env?"),
    ("slurm", "exclusive=yes", "-cfg exclusive=yes is not a bool; pass exclusive=True or "
     "exclusive=False"),
    ("kubernetes", "read_only_root_fs=nope", "pass read_only_root_fs=True"),
    ("local_cwd", "prepend_cwd=1", "pass prepend_cwd=True or prepend_cwd=False"),
])
def test_run_options_are_read_strictly(scheduler, cfg, message):
    opts = get_scheduler_factories()[scheduler]("test").run_opts()
    with pytest.raises(ComponentArgumentError, match=re.escape(message)):
        opts.cfg_from_str(cfg)


def test_valid_run_options_still_parse():
    opts = get_scheduler_factories()["slurm"]("test").run_opts()
    assert opts.cfg_from_str("partition=gpu,exclusive=TRUE,time=1:00:00") == {
        "partition": "gpu", "exclusive": True, "time": "1:00:00"}
    opts = get_scheduler_factories()["kubernetes"]("test").run_opts()
    assert opts.cfg_from_str("queue=q,tolerations=a:NoSchedule;b:NoExecute")["tolerations"] == [
        "a:NoSchedule", "b:NoExecute"]


@pytest.mark.slow
def test_torchx_by_path_without_an_activated_venv_runs_the_job(tmp_path):
    """``.venv/bin/torchx run`` with the venv's bin off PATH: the job still finds torchrun."""
    bin_dir = Path(sys.executable).parent
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                           if Path(p).resolve() != bin_dir.resolve())
    env = {"VIRTUAL_ENV": None, "PATH": path, "HOME": str(tmp_path)}
    out = tmp_path / "run"
    proc = run_command(
        [str(bin_dir / "torchx"), "run", f"{REPO}/components/ddp.py:ddp", "-j", "1x1",
         "--", "--model", "tiny", "--steps", "3", "--output-dir", str(out)],
        cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(losses(out)) == [1, 2, 3]


def _gpu_cluster_commands() -> list[list[str]]:
    """The ``torchx run`` commands of README's "On your GPU cluster", as words."""
    section = (REPO / "README.md").read_text().split("## On your GPU cluster", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return [line.split() for line in block.splitlines() if line.startswith("torchx run ")]


def test_readme_gpu_cluster_command_is_accepted_on_kubernetes():
    assert_readme_command_accepted("kubernetes")  # Slurm's: tests/system/test_slurm_commands.py


def assert_readme_command_accepted(scheduler: str) -> None:
    """README's command for ``scheduler``, dry-run as README gives it (Slurm on the local
    cluster's partition ``debug``)."""
    (words,) = [w for w in _gpu_cluster_commands() if w[3] == scheduler]
    if scheduler == "slurm":
        words = [w.replace("partition=gpu", "partition=debug") for w in words]
    proc = torchx_cli("run", "--dryrun", "--workspace", "", *words[2:])
    assert proc.returncode == 0, proc.stderr[-2000:]
    request_text = proc.stdout.split("=== SCHEDULER REQUEST ===", 1)[1]
    if scheduler == "slurm":  # 8 GPUs: 64 CPUs and 256 GiB per node
        assert "--cpus-per-task=64" in request_text and "--mem=262144" in request_text
    else:
        assert "cpu: 64000m" in request_text and "memory: 262144M" in request_text
        assert "nvidia.com/gpu: '8'" in request_text

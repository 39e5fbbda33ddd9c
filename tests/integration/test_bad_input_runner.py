"""Wrong input that reaches the components and schedulers another way than ``torchx run``'s
arguments: run options given as a dict to TorchX's Python runner (``dryrun_component(...,
cfg=...)``), component and trainer arguments given to the runner, and a ``.torchxconfig``.
Each is refused with one line that names the fix, without a traceback, before anything is
scheduled (and, on Slurm, before the cluster is asked anything).

The runner rows run in this process; the ``.torchxconfig`` rows check the files in this process
and, once per kind, through the real CLI (``torchx run --dryrun`` in the file's directory).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from torchx.runner import get_runner

from components import cli
from components.errors import ComponentArgumentError
from tests.integration.test_bad_input_matrix import FIX
from tests.support.runs import REPO, torchx_cli

DDP = f"{REPO}/components/ddp.py:ddp"
TINY = ["--", "--model", "tiny"]
# What each scheduler needs to render a job without an error of its own.
REQUIRED = {"local_cwd": {}, "slurm": {}, "kubernetes": {"queue": "q"},
            "kubernetes_jobset": {"local_queue": "q"}}


def _refusal(scheduler: str, args: list[str], cfg: dict[str, object]) -> str:
    """The one-line message of the runner's dry run of ``args`` on ``scheduler``."""
    with get_runner() as runner, pytest.raises(ComponentArgumentError) as info:
        runner.dryrun_component(DDP, args, scheduler, cfg={**REQUIRED[scheduler], **cfg},
                                workspace=None)
    message = str(info.value)
    assert "\n" not in message and FIX.search(message), message
    return message


@pytest.fixture(autouse=True)
def no_slurm_cluster(tmp_path, monkeypatch) -> Iterator[Path]:
    """Slurm's commands on PATH that only record being called: a refused option never reaches
    the Slurm pre-flight (which asks scontrol and sacctmgr)."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    for tool in ("scontrol", "sinfo", "sacctmgr", "sbatch", "squeue"):
        (bin_dir / tool).write_text(f"#!/bin/sh\necho {tool} >> {tmp_path}/slurm-called\nexit 1\n")
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    yield tmp_path / "slurm-called"
    assert not (tmp_path / "slurm-called").exists()


RUN_OPTIONS = [
    ("local_cwd", {"log_dirr": "/tmp/x"},
     "local_cwd: run option log_dirr='/tmp/x': local_cwd has no run option log_dirr; did you "
     "mean log_dir? (`torchx runopts local_cwd` lists them)"),
    ("local_cwd", {"prepend_cwd": "true"},
     "local_cwd: run option prepend_cwd='true' is not a bool; pass prepend_cwd=True or "
     "prepend_cwd=False"),
    ("slurm", {"partiton": "gpu"},
     "slurm: run option partiton='gpu': slurm has no run option partiton; did you mean "
     "partition? (`torchx runopts slurm` lists them)"),
    ("slurm", {"signal_grace": "5m"},
     "slurm: run option signal_grace='5m' is not an int; pass e.g. signal_grace=1"),
    ("slurm", {"exclusive": 1},
     "slurm: run option exclusive=1 is not a bool; pass exclusive=True or exclusive=False"),
    ("kubernetes", {"namepsace": "team-a"},
     "kubernetes: run option namepsace='team-a': kubernetes has no run option namepsace; did you "
     "mean namespace? (`torchx runopts kubernetes` lists them)"),
    ("kubernetes", {"termination_grace_s": "2m"},
     "kubernetes: run option termination_grace_s='2m' is not an int; pass e.g. "
     "termination_grace_s=1"),
    ("kubernetes", {"tolerations": "nvidia.com/gpu:NoSchedule"},
     "kubernetes: run option tolerations='nvidia.com/gpu:NoSchedule' is not a list of str; pass "
     "e.g. tolerations=['A', 'B']"),
    ("kubernetes", {"queue": 7},
     "kubernetes: run option queue=7 is not a str; pass e.g. queue='TEXT'"),
    ("kubernetes_jobset", {"queue": "team-a"},
     "kubernetes_jobset: run option queue='team-a': kubernetes_jobset has no run option queue; "
     "did you mean local_queue? (`torchx runopts kubernetes_jobset` lists them)"),
    ("kubernetes_jobset", {"shm_size": 1024},
     "kubernetes_jobset: run option shm_size=1024 is not a str; pass e.g. shm_size='TEXT'"),
]


@pytest.mark.parametrize(("scheduler", "cfg", "message"), RUN_OPTIONS,
                         ids=[f"{s}-{next(iter(c))}" for s, c, _ in RUN_OPTIONS])
def test_a_bad_run_option_given_to_the_runner_is_one_line(scheduler, cfg, message):
    assert _refusal(scheduler, ["-j", "1x2", *TINY], cfg) == message


ARGUMENTS = [
    ("slurm", ["-j", "2xtwo", *TINY],
     "-j 2xtwo: expected [min_nodes:]NODESxPROCS_PER_NODE, e.g. 1x2 or 1:2x4"),
    ("local_cwd", ["-j", "2x1", "--rdzv_port", "70000", *TINY],
     "--rdzv_port 70000: not a TCP port; pass 1-65535, or 0 for a free port"),
    ("kubernetes", ["-j", "1x2", "--mounts", "type=volume,dst=/data", *TINY],
     "--mounts type=volume,dst=/data: no src=; expected type=bind|volume|device,src=SOURCE,"
     "dst=/PATH[,readonly], e.g. type=volume,src=my-claim,dst=/data"),
    ("kubernetes_jobset", ["-j", "1x2", *TINY, "--batch-size", "15"],
     "trainers.ddp: --batch-size 15 is not divisible by --grad-accum 1 x data-parallel size 2; "
     "pass a multiple of 2"),
    ("slurm", ["-j", "1x2", *TINY, "--cpu-offload"],
     "trainers.ddp: --cpu-offload is not served by trainers.ddp; use trainers.fsdp or "
     "trainers.pipeline or drop --cpu-offload"),
    ("local_cwd", ["-j", "1x2", "--gpu", "2", *TINY],
     "trainers.ddp: --gpu 2: name the GPUs so the job is checked to fit before it is scheduled; "
     "pass --gpu_type (one of"),
]


@pytest.mark.parametrize(("scheduler", "args", "message"), ARGUMENTS,
                         ids=[f"{s}-{' '.join(a[:4])}" for s, a, _ in ARGUMENTS])
def test_a_bad_argument_given_to_the_runner_is_one_line(scheduler, args, message):
    assert _refusal(scheduler, args, {}).startswith(message)


def test_good_run_options_still_reach_the_scheduler(no_slurm_cluster):
    """A dict of valid options (a bool, an int, a list) renders; on Slurm the pre-flight then
    asks the cluster (here: the recording scontrol, which fails)."""
    with get_runner() as runner:
        info = runner.dryrun_component(
            DDP, ["-j", "1x2", *TINY], "kubernetes", workspace=None,
            cfg={"queue": "q", "termination_grace_s": 300, "read_only_root_fs": True,
                 "tolerations": ["nvidia.com/gpu:NoSchedule"]})
        assert "terminationGracePeriodSeconds: 300" in str(info)
        with pytest.raises(ComponentArgumentError, match="cannot reach the Slurm controller"):
            runner.dryrun_component(DDP, ["-j", "1x2", *TINY], "slurm", workspace=None,
                                    cfg={"partition": "debug", "exclusive": True})
    assert no_slurm_cluster.read_text().split() == ["scontrol"]
    no_slurm_cluster.unlink()


CONFIG_FILES = [
    ("kubernetes", "[kubernetes]\nqueue = q\ntermination_grace_s = 2m\n",
     "kubernetes: {file} [kubernetes] termination_grace_s = 2m is not an int; pass e.g. "
     "termination_grace_s = 1"),
    ("kubernetes", "[kubernetes]\nqueue = q\nnamepsace = team-a\n",
     "kubernetes: {file} [kubernetes] namepsace = team-a: kubernetes has no run option "
     "namepsace; did you mean namespace? (`torchx runopts kubernetes` lists them)"),
    ("kubernetes_jobset", "[kubernetes_jobset]\nlocal_queue = q\nread_only_root_fs = maybe\n",
     "kubernetes_jobset: {file} [kubernetes_jobset] read_only_root_fs = maybe is not a bool; pass "
     "read_only_root_fs = True or read_only_root_fs = False"),
    ("slurm", "[slurm]\npartiton = debug\n",
     "slurm: {file} [slurm] partiton = debug: slurm has no run option partiton; did you mean "
     "partition? (`torchx runopts slurm` lists them)"),
    ("slurm", "[slurm]\nsignal_grace = 1m\n",
     "slurm: {file} [slurm] signal_grace = 1m is not an int; pass e.g. signal_grace = 1"),
    ("local_cwd", "[local_cwd]\nlogdir = /tmp/x\n",
     "local_cwd: {file} [local_cwd] logdir = /tmp/x: local_cwd has no run option logdir; did you "
     "mean log_dir? (`torchx runopts local_cwd` lists them)"),
    ("local_cwd", "[local_cwd]\nlog_dir = 100%\n",
     "{file}: TorchX cannot read it ('%' must be followed by '%' or '(', found: '%'); fix it as "
     "https://pytorch.org/torchx/latest/runner.config.html shows"),
    ("local_cwd", "log_dir = /tmp/x\n",
     "{file}: TorchX cannot read it (File contains no section headers. file: '{file}', line: 1 "
     "'log_dir = /tmp/x\\n'); fix it as https://pytorch.org/torchx/latest/runner.config.html "
     "shows"),
]
CONFIG_IDS = ["grace-not-an-int", "misspelt-key", "bool-not-a-bool", "slurm-misspelt-key",
              "slurm-grace-not-an-int", "local-misspelt-key", "percent", "no-section"]


@pytest.mark.parametrize(("scheduler", "text", "message"), CONFIG_FILES, ids=CONFIG_IDS)
def test_a_bad_torchxconfig_is_one_line_naming_file_section_and_key(
        tmp_path, monkeypatch, scheduler, text, message):
    config = tmp_path / ".torchxconfig"
    config.write_text(text)
    monkeypatch.setenv("TORCHXCONFIG", str(config))  # TorchX's find_configs reads only it
    with pytest.raises(ComponentArgumentError) as info:
        cli.check_torchxconfig(scheduler)
    assert str(info.value) == message.format(file=config)


def test_a_good_torchxconfig_and_the_repositorys_own_pass(tmp_path, monkeypatch):
    """INI's bool words, lists, None and the repository's .torchxconfig are all accepted."""
    config = tmp_path / ".torchxconfig"
    config.write_text("[kubernetes]\nqueue = q\nread_only_root_fs = yes\ntermination_grace_s = "
                      "300\ntolerations = a:NoSchedule;b:NoExecute\nnamespace = None\n")
    monkeypatch.setenv("TORCHXCONFIG", str(config))
    cli.check_torchxconfig("kubernetes")
    for scheduler in REQUIRED:
        monkeypatch.setenv("TORCHXCONFIG", str(REPO / ".torchxconfig"))
        cli.check_torchxconfig(scheduler)


# One row of each kind through the CLI: a value, a key, and a section TorchX cannot read.
CLI_ROWS = [(CONFIG_FILES[i], CONFIG_IDS[i]) for i in (0, 3, 6)]


@pytest.mark.parametrize(("row", "name"), CLI_ROWS, ids=[name for _, name in CLI_ROWS])
def test_torchx_run_with_a_bad_torchxconfig_exits_1_in_one_line(tmp_path, row, name):
    scheduler, text, message = row
    (tmp_path / ".torchxconfig").write_text(text)
    workspace = [] if scheduler == "local_cwd" else ["--workspace", ""]
    proc = torchx_cli("run", "--dryrun", "-s", scheduler, *workspace, DDP, "-j", "1x2", *TINY,
                      cwd=tmp_path, env={"HOME": str(tmp_path)})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    assert "Traceback" not in output and "=== SCHEDULER REQUEST ===" not in output, output
    assert proc.stderr.splitlines()[-1].endswith(
        message.format(file=tmp_path / ".torchxconfig")), proc.stderr[-3000:]

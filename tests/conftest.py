"""Shared helpers: run a trainer as one process or under torchrun, read what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytest_plugins = ["pytester", "tests.slurm_support"]

# Small, fast settings for the tiny model; tests add or override flags.
TINY = ["--model", "tiny", "--batch-size", "8", "--steps", "8", "--warmup-steps", "2",
        "--eval-every", "0", "--tensorboard", "false", "--log-every", "1",
        "--peak-tflops", "1", "--train-samples", "256", "--resume", "none"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    # torchx's local_cwd runs `torchrun` from PATH: take this interpreter's environment's.
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_trainer(args: list[str], nproc: int = 1, module: str = "trainers.ddp",
                check: bool = True) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` (nproc 1) or the same under ``torchrun --nproc_per_node``."""
    if nproc == 1:
        cmd = [sys.executable, "-m", module, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", "-m", module, *args]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def torchx_cli(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m torchx.cli.main <args>`` in ``cwd`` with the tests' environment plus ``env``
    (a process each time: TorchX's CLI keeps global argument state)."""
    return subprocess.run([sys.executable, "-m", "torchx.cli.main", *args], cwd=cwd,
                          env={**_env(), **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def losses(run_dir: Path) -> dict[int, float]:
    """Per-step training loss from a run's metrics.jsonl."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records}


def assert_close(actual: dict[int, float], expected: dict[int, float], rel: float = 1e-5) -> None:
    assert actual.keys() == expected.keys(), (sorted(actual), sorted(expected))
    for step in expected:
        diff = abs(actual[step] - expected[step]) / abs(expected[step])
        assert diff <= rel, f"step {step}: {actual[step]} vs {expected[step]} (rel {diff:.2e})"


@pytest.fixture(scope="session")
def single_process(tmp_path_factory) -> dict[int, float]:
    """Per-step losses of the reference: one process, global batch 16, no accumulation."""
    run_dir = tmp_path_factory.mktemp("single")
    run_trainer([*TINY, "--batch-size", "16", "--output-dir", str(run_dir)])
    return losses(run_dir)


@pytest.fixture
def world_of_one():
    """A process group of one in this process (what a trainer run without torchrun forms)."""
    from trainers.core.distributed import init_distributed
    from trainers.spec.config import parse_config

    with init_distributed(parse_config(["--device", "cpu"], "ddp")) as env:
        yield env



@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true a skipped test fails: in CI a missing service must not pass silently."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") \
            and os.environ.get("CI", "").lower() == "true":
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which requires every test to run: {reason}"

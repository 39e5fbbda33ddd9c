"""The console scripts of pyproject.toml's ``[project.scripts]`` (``ttx-plan``, ...): the
installed metadata names each of them, each resolves to its command's ``main`` (or a wrapper
that returns nothing, since a console script exits with its function's return value), and the
installed scripts run: ``ttx-plan`` plans, ``ttx-plot`` exits 0 after writing its image and 2
with one line on bad input."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.support.processes import run_command
from tests.support.runs import REPO, TINY, run_trainer

SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
BIN = Path(sys.executable).parent


def _script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_command([str(BIN / name), *args])


def test_every_script_is_installed_and_names_a_command_of_trainers():
    installed = {e.name: e.value for e in importlib.metadata.entry_points(group="console_scripts")
                 if e.name.startswith("ttx-")}
    assert installed == SCRIPTS  # pip install -e . again after changing the table
    for name, target in SCRIPTS.items():
        module, _, function = target.partition(":")
        command = name.removeprefix("ttx-").replace("-", "_")
        assert module.startswith("trainers.") and command in module.split(".")[1:], name
        assert function in ("main", "cli") and (BIN / name).is_file(), name


def test_installed_scripts_run_and_exit_with_the_commands_status(tmp_path):
    plan = _script("ttx-plan", "--model", "tiny", "--nodes", "1", "--devices-per-node", "2",
                   "--device-memory-gb", "16")
    assert plan.returncode == 0 and "recommended: " in plan.stdout, plan.stderr[-2000:]
    run_trainer([*TINY, "--steps", "2", "--output-dir", str(tmp_path / "run")])
    plot = _script("ttx-plot", str(tmp_path / "run"), "-o", str(tmp_path / "p.png"))
    assert plot.returncode == 0 and plot.stderr == "", plot.stderr[-2000:]
    assert (tmp_path / "p.png").stat().st_size > 0
    bad = _script("ttx-plot", str(tmp_path / "nothing"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith("trainers.tools.plot: error: ")

"""What a run directory records about how its run was started, and what a resume changed.

``config.json`` (written at the start of every attempt, on rank 0) holds every resolved
option, the command line, the world size, the git commit of these trainers and whether the
checkout had uncommitted changes, and the versions of Python, torch and TorchX: enough to
start the same run again. :func:`changed_options` compares the options a checkpoint was saved
with against the ones a resume passes. Plain Python without torch.
"""

from __future__ import annotations

import json
import platform
import subprocess
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from trainers.runs.storage import RunPath, write_bytes_atomic

CONFIG_FILE = "config.json"
# Options that name where an attempt reads and writes: they may differ between attempts.
_PER_ATTEMPT = frozenset({"resume", "output_dir"})


def git_state(path: Path) -> dict[str, Any]:
    """The commit checked out at ``path`` and whether tracked files differ from it (None for
    both when ``path`` is not inside a git checkout or git is missing)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True,
                                text=True, timeout=10)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=path, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}
    if commit.returncode or status.returncode:
        return {"commit": None, "dirty": None}
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def run_record(options: dict[str, Any], trainer: str, argv: Sequence[str],
               world_size: int) -> dict[str, Any]:
    """The contents of ``config.json``: the resolved ``options`` (a TrainConfig as a dict) of
    ``python -m trainers.<trainer> <argv>`` at ``world_size`` ranks, where the code came from
    and the versions it ran with."""
    return {
        "trainer": trainer, "command": ["python", "-m", f"trainers.{trainer}", *argv],
        "world_size": world_size, "options": options,
        "git": git_state(Path(__file__).resolve().parent),
        "versions": {"python": platform.python_version(), "torch": _version("torch"),
                     "torchx": _version("torchx")},
    }


def write_config(run_dir: RunPath, record: dict[str, Any]) -> RunPath:
    """Write ``record`` as ``run_dir/config.json`` atomically; return its path."""
    path = run_dir / CONFIG_FILE
    write_bytes_atomic(path, (json.dumps(record, indent=2) + "\n").encode())
    return path


def read_config(run_dir: RunPath) -> dict[str, Any] | None:
    """``run_dir/config.json``, or None if the run wrote none."""
    path = run_dir / CONFIG_FILE
    return json.loads(path.read_text()) if path.exists() else None


def changed_options(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Every option whose value differs between ``saved`` and ``now`` (TrainConfig dicts), as
    ``--flag OLD -> NEW``, leaving out where an attempt reads and writes."""
    return [f"--{name.replace('_', '-')} {saved[name]} -> {value}"
            for name, value in now.items()
            if name in saved and name not in _PER_ATTEMPT and saved[name] != value]

"""Checkpoints on disk: where they live, their manifest, and how to tell an intact one.

A run's checkpoints are ``<run>/checkpoints/step_<N>/`` directories; a finished one holds
``manifest.json`` with the size and CRC-32 of every file. Plain Python without torch, so
components can check ``--resume`` before anything is scheduled.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

from trainers.torchfree.errors import ConfigError

# The layout of a checkpoint's contents; 2: the model and optimizer, the step ("progress") and
# the data position as separate DCP entries, per-rank state in rank_state<R>.pt; the manifest's
# "run" holds what the loop keeps across attempts (the LR schedule's length, the first loss).
# Earlier format-2 checkpoints also hold a "schedule" entry, which loading leaves unread: the
# learning rate is a function of the step (trainers.core.loop.lr_factor).
FORMAT = 2
CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"
PREFIX = "step_"


def step_of(path: Path) -> int:
    """The step of checkpoint directory ``path`` (``step_<N>``)."""
    return int(path.name[len(PREFIX):])


def find_checkpoints(path: Path) -> list[Path]:
    """Finished checkpoints at ``path`` (a run, its checkpoints/ or one step_N), newest first."""
    if path.name.startswith(PREFIX) and (path / MANIFEST).exists():
        return [path]
    for folder in (path / CHECKPOINTS, path):
        if folder.is_dir():
            found = [p for p in folder.iterdir()
                     if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()]
            if found:
                return sorted(found, key=step_of, reverse=True)
    return []


def crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def verify(path: Path) -> str | None:
    """None if every file in ``path``'s manifest is intact, else what is wrong."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        return f"unreadable {MANIFEST} ({err.__class__.__name__})"
    for name, (size, crc) in manifest["files"].items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes, expected {size}"
        if crc32(file) != crc:
            return f"{name} fails its CRC-32 check"
    return None


def saved_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of the newest checkpoint at ``path`` with a readable one."""
    for checkpoint in find_checkpoints(path):
        try:
            return json.loads((checkpoint / MANIFEST).read_text())
        except (OSError, ValueError):
            continue
    return None


def check_format(path: Path, manifest: dict[str, Any]) -> None:
    """ConfigError unless the checkpoint at ``path`` is in the layout these trainers read."""
    found = manifest.get("format", 1)
    if found != FORMAT:
        raise ConfigError(f"{path} holds a format-{found} checkpoint from an earlier version of "
                          f"these trainers, which read format {FORMAT}; resume it with the "
                          "version that wrote it, or pass --resume none with a new --output-dir")

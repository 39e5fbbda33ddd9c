"""Checkpoints on disk or in a bucket: where they live, their manifest, and how to tell an
intact one.

A run's checkpoints are ``<run>/checkpoints/step_<N>/`` directories (prefixes on an object
store). ``manifest.json``, written last and only once every rank's files are written, is the
commit marker: a ``step_<N>`` without one is an unfinished (or abandoned) save and is no
checkpoint. The manifest holds the size and checksum of every file: the CRC-32 of its contents
on disk (``"checksum": "crc32"``), the store's own content hash on an object store
(``"checksum": "store"``, S3's ETag). Plain Python without torch, so components can check
``--resume`` before anything is scheduled; paths are ``pathlib.Path`` or ``upath.UPath``
(:func:`trainers.runs.storage.location`).
"""

from __future__ import annotations

import json
from typing import Any

from trainers.errors import ConfigError
from trainers.runs.storage import RunPath, crc32, is_remote, listing

# The layout of a checkpoint's contents; 2: the model and optimizer, the step ("progress") and
# the data position as separate DCP entries, per-rank state in rank_state<R>.pt; the manifest's
# "run" holds what the loop keeps across attempts (the LR schedule's length, the first loss).
# Earlier format-2 checkpoints also hold a "schedule" entry, which loading leaves unread: the
# learning rate is a function of the step (trainers.core.loop.lr_factor).
FORMAT = 2
CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"
PREFIX = "step_"


def step_of(path: RunPath) -> int:
    """The step of checkpoint directory ``path`` (``step_<N>``)."""
    return int(path.name[len(PREFIX):])


def step_dirs(folder: RunPath) -> list[RunPath]:
    """Every ``step_<N>`` directly in ``folder``, committed or not, newest first; none when
    ``folder`` is not there. In a bucket a folder is a prefix of objects, which may be gone by
    the time it is listed (another rank's store check writes a probe object under a new run's
    prefix and deletes it), so a listing that finds no folder finds no checkpoint."""
    try:
        children = list(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = [p for p in children
             if p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit() and p.is_dir()]
    return sorted(found, key=step_of, reverse=True)


def is_committed(checkpoint: RunPath) -> bool:
    """Whether ``step_<N>`` directory ``checkpoint`` holds its commit marker."""
    return (checkpoint / MANIFEST).is_file()


def find_checkpoints(path: RunPath) -> list[RunPath]:
    """Committed checkpoints at ``path`` (a run, its checkpoints/ or one step_N), newest
    first; a ``step_<N>`` without a manifest is no checkpoint."""
    if path.name.startswith(PREFIX):
        return [path] if is_committed(path) else []
    for folder in (path / CHECKPOINTS, path):
        found = [p for p in step_dirs(folder) if is_committed(p)]
        if found:
            return found
    return []


def file_checksums(folder: RunPath) -> dict[str, Any]:
    """What the manifest of checkpoint ``folder`` records of its files: ``checksum`` (how
    they are hashed) and ``files`` (name -> [size, checksum])."""
    return {"checksum": "store" if is_remote(folder) else "crc32",
            "files": {name: list(entry) for name, entry in listing(folder).items()}}


def verify(path: RunPath) -> str | None:
    """None if every file in ``path``'s manifest is intact, else what is wrong."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        return f"unreadable {MANIFEST} ({err.__class__.__name__})"
    by_store = manifest.get("checksum", "crc32") == "store"
    present = listing(path) if by_store else {}
    for name, (size, checksum) in manifest["files"].items():
        file = path / name
        if by_store:
            if name not in present:
                return f"{name} is missing"
            found_size, found = present[name]
        elif not file.is_file():
            return f"{name} is missing"
        else:
            found_size, found = file.stat().st_size, None
        if found_size != size:
            return f"{name} has {found_size} bytes, expected {size}"
        if (found if by_store else crc32(file)) != checksum:
            return f"{name} fails its {'content hash' if by_store else 'CRC-32'} check"
    return None


def saved_manifest(path: RunPath) -> dict[str, Any] | None:
    """The manifest of the newest checkpoint at ``path`` with a readable one."""
    for checkpoint in find_checkpoints(path):
        try:
            return json.loads((checkpoint / MANIFEST).read_text())
        except (OSError, ValueError):
            continue
    return None


def check_format(path: RunPath, manifest: dict[str, Any]) -> None:
    """ConfigError unless the checkpoint at ``path`` is in the layout these trainers read."""
    found = manifest.get("format", 1)
    if found != FORMAT:
        raise ConfigError(f"{path} holds a format-{found} checkpoint from an earlier version of "
                          f"these trainers, which read format {FORMAT}; resume it with the "
                          "version that wrote it, or pass --resume none with a new --output-dir")

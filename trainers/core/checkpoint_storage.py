"""Where checkpoints live: every file operation on ``<run>/checkpoints/`` besides DCP's own
shards, on a local (or mounted) file system.

A checkpoint is written as ``step_<N>.tmp`` (:func:`tmp_path`, :func:`prepare`), holding
DCP's shards, one ``rank_state<R>.pt`` per rank (:func:`write_rank_state`) and, last,
``manifest.json`` with the size and CRC-32 of every file (:func:`write_manifest`); it becomes
``step_<N>`` only by the rename of :func:`publish`. :func:`find_resumable` picks the
checkpoint a run resumes from, verifying manifests; :func:`prune` keeps the newest. The
collective protocol around these (who writes what when) is
:class:`trainers.core.checkpoint.Checkpointer`'s.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException

from trainers.torchfree.checkpoint_files import (
    MANIFEST,
    PREFIX,
    check_format,
    crc32,
    find_checkpoints,
    verify,
)
from trainers.torchfree.errors import ConfigError

log = logging.getLogger(__name__)

# What a failed write raises: an OS error, a storage error, or DCP's collected failures.
WRITE_ERRORS = (OSError, RuntimeError, CheckpointException)
TMP = ".tmp"


def tmp_path(folder: Path, step: int) -> Path:
    """Where checkpoint ``step`` is written in ``folder`` before it is published."""
    return folder / f"{PREFIX}{step:08d}{TMP}"


def prepare(tmp: Path) -> None:
    """Make ``tmp`` (:func:`tmp_path`) a fresh, empty folder (one rank does, for all)."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)


def _rank_file(checkpoint: Path, rank: int) -> Path:
    return checkpoint / f"rank_state{rank}.pt"


def write_rank_state(checkpoint: Path, rank: int, state: dict[str, Any]) -> None:
    """Rank ``rank``'s private ``state`` into ``checkpoint``."""
    torch.save(state, _rank_file(checkpoint, rank))


def saved_world_size(checkpoint: Path) -> int:
    """The number of ranks that saved ``checkpoint``."""
    return json.loads((checkpoint / MANIFEST).read_text())["world_size"]


def read_rank_state(checkpoint: Path, rank: int) -> dict[str, Any] | None:
    """Rank ``rank``'s private state in ``checkpoint`` (None if it has none)."""
    path = _rank_file(checkpoint, rank)
    return torch.load(path, weights_only=True) if path.exists() else None


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """``manifest`` plus the size and CRC-32 of every file of ``folder``, as ``manifest.json``
    there, on disk before it returns. Still inside ``step_<N>.tmp``, it makes no checkpoint:
    that takes :func:`publish`, after every rank's write succeeded."""
    files = {p.name: [p.stat().st_size, crc32(p)] for p in sorted(folder.iterdir())}
    with open(folder / MANIFEST, "w") as f:
        json.dump({**manifest, "files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def discard(tmp: Path) -> None:
    """Delete the unfinished checkpoint ``tmp``."""
    shutil.rmtree(tmp, ignore_errors=True)


def publish(tmp: Path) -> Path:
    """Rename ``step_<N>.tmp`` to ``step_<N>`` (replacing one of the same step) durably: the
    moment the checkpoint exists. Returns its path."""
    final = final_path(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    return final


def final_path(tmp: Path) -> Path:
    """The path ``step_<N>.tmp`` gets once published."""
    return tmp.with_name(tmp.name.removesuffix(TMP))


def prune(folder: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest checkpoints of ``folder``."""
    for old in find_checkpoints(folder)[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def find_resumable(resume: str, folder: Path) -> Path | None:
    """The checkpoint ``--resume resume`` names (``auto``: the newest valid one of ``folder``;
    ``none``; or a run or checkpoint directory), falling back with a warning past corrupt ones.
    ConfigError (one line) when a named one has none or all are corrupt."""
    if resume == "none":
        return None
    candidates = find_checkpoints(folder if resume == "auto" else Path(resume))
    if not candidates:
        if resume == "auto":
            return None
        raise ConfigError(f"--resume {resume}: no checkpoint there; pass a run directory "
                          "holding checkpoints/step_*, a step_* directory, auto or none")
    for path in candidates:
        problem = verify(path)
        if problem is None:
            check_format(path, json.loads((path / MANIFEST).read_text()))
            return path
        log.warning("checkpoint %s is corrupt (%s); falling back to an older one", path, problem)
    raise ConfigError(f"--resume {resume}: every checkpoint is corrupt (newest: "
                      f"{candidates[0]}); pass --resume none with a new --output-dir")


def write_failure(err: BaseException, folder: Path) -> str:
    """A one-line reason for a failed checkpoint write: the OS error if there is one, "the file
    system is full" when little space is left (torch's zip writer hides ENOSPC), else the last
    line of the error."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        seen = seen.__cause__ or seen.__context__
    free = shutil.disk_usage(folder).free
    if free < 64 * 2**20:
        return f"the file system is full: {free / 2**20:.1f} MiB free"
    lines = str(err).strip().splitlines()
    return lines[-1].strip() if lines else type(err).__name__


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

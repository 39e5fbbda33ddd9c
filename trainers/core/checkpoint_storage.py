"""Where checkpoints live: every file operation on ``<run>/checkpoints/`` besides DCP's own
shards, on a local (or mounted) file system or an object store (paths from
:func:`trainers.runs.storage.location`).

One protocol for both, with no rename (an object store has no atomic directory rename, and a
copy of a large checkpoint is no commit): checkpoint ``step_<N>/`` is emptied
(:func:`prepare`), every rank writes its ``rank_state<R>.pt`` (:func:`write_rank_state`) and
DCP's shards straight into it, and once every rank's write succeeded rank 0 writes
``manifest.json`` (:func:`commit`), the commit marker: one atomic file write (a PUT on an
object store) with the size and checksum of every file. A ``step_<N>`` without a manifest is no
checkpoint to resume, prune, sample or export (:mod:`trainers.runs.checkpoint_files`);
:func:`prune` keeps the newest committed ones and removes abandoned uncommitted steps.
:func:`find_resumable` picks the checkpoint a run resumes from, verifying manifests. The
collective protocol around these (who writes what when) is
:class:`trainers.core.checkpoint.Checkpointer`'s.
"""

from __future__ import annotations

import json
import logging
import shutil
from typing import Any

import torch
from torch.distributed.checkpoint import StorageWriter
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
from torch.distributed.checkpoint.api import CheckpointException

from trainers.errors import ConfigError
from trainers.runs.checkpoint_files import (
    MANIFEST,
    PREFIX,
    check_format,
    file_checksums,
    find_checkpoints,
    is_committed,
    step_dirs,
    step_of,
    verify,
)
from trainers.runs.storage import RunPath, is_remote, location, remove, write_bytes_atomic

log = logging.getLogger(__name__)

# What a failed write raises: an OS error, a storage error, or DCP's collected failures.
WRITE_ERRORS = (OSError, RuntimeError, CheckpointException)


def checkpoint_path(folder: RunPath, step: int) -> RunPath:
    """Where checkpoint ``step`` of the run whose checkpoints are in ``folder`` is written."""
    return folder / f"{PREFIX}{step:08d}"


def dcp_checkpoint_id(checkpoint: RunPath) -> Any:
    """``checkpoint`` as DCP's ``checkpoint_id``: a ``Path`` picks its file-system writer and
    reader, a URL string its fsspec ones."""
    return str(checkpoint) if is_remote(checkpoint) else checkpoint


def dcp_writer(checkpoint: RunPath) -> StorageWriter | None:
    """DCP's writer for ``checkpoint``: None (DCP picks its file-system writer, which fsyncs
    every file) on disk; for a URL its fsspec writer without file syncing. An object is durable
    once its upload completes, and an object-store stream has no file descriptor, so DCP would
    otherwise fall back to ``os.sync()`` of the whole node, twice per save."""
    return FsspecWriter(str(checkpoint), sync_files=False) if is_remote(checkpoint) else None


def prepare(checkpoint: RunPath) -> None:
    """Make ``checkpoint`` an empty, uncommitted directory (one rank does, for all): its
    manifest goes first, so an interrupted clean-up never leaves a committed-looking step."""
    manifest = checkpoint / MANIFEST
    if manifest.exists():
        manifest.unlink()
    remove(checkpoint)
    checkpoint.mkdir(parents=True, exist_ok=True)


def _rank_file(checkpoint: RunPath, rank: int) -> RunPath:
    return checkpoint / f"rank_state{rank}.pt"


def write_rank_state(checkpoint: RunPath, rank: int, state: dict[str, Any]) -> None:
    """Rank ``rank``'s private ``state`` into ``checkpoint``."""
    with _rank_file(checkpoint, rank).open("wb") as f:
        torch.save(state, f)


def saved_world_size(checkpoint: RunPath) -> int:
    """The number of ranks that saved ``checkpoint``."""
    return json.loads((checkpoint / MANIFEST).read_text())["world_size"]


def read_rank_state(checkpoint: RunPath, rank: int) -> dict[str, Any] | None:
    """Rank ``rank``'s private state in ``checkpoint`` (None if it has none)."""
    path = _rank_file(checkpoint, rank)
    if not path.exists():
        return None
    with path.open("rb") as f:
        return torch.load(f, weights_only=True)


def commit(checkpoint: RunPath, manifest: dict[str, Any]) -> None:
    """Commit ``checkpoint``: ``manifest`` plus the size and checksum of every file there,
    written atomically as ``manifest.json`` (rank 0, after every rank's write succeeded)."""
    record = {**manifest, **file_checksums(checkpoint)}
    write_bytes_atomic(checkpoint / MANIFEST, json.dumps(record, indent=1).encode())


def prune(folder: RunPath, keep: int) -> None:
    """Delete all but the ``keep`` newest committed checkpoints of ``folder``, and every
    uncommitted step older than the newest committed one (a save abandoned by a crash)."""
    committed = find_checkpoints(folder)
    for old in committed[keep:]:
        remove(old)
    if committed:
        newest = step_of(committed[0])
        for step in step_dirs(folder):
            if step_of(step) < newest and not is_committed(step):
                remove(step)


def find_resumable(resume: str, folder: RunPath) -> RunPath | None:
    """The checkpoint ``--resume resume`` names (``auto``: the newest valid one of ``folder``;
    ``none``; or a run or checkpoint directory or URL), falling back with a warning past corrupt
    ones. ConfigError (one line) when a named one has none or all are corrupt."""
    if resume == "none":
        return None
    candidates = find_checkpoints(folder if resume == "auto" else location(resume, "--resume"))
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


def write_failure(err: BaseException, folder: RunPath) -> str:
    """A one-line reason for a failed checkpoint write: the OS error if there is one, "the file
    system is full" when little space is left on a local disk (torch's zip writer hides
    ENOSPC), else the last line of the error."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        seen = seen.__cause__ or seen.__context__
    if not is_remote(folder):
        free = shutil.disk_usage(folder).free
        if free < 64 * 2**20:
            return f"the file system is full: {free / 2**20:.1f} MiB free"
    lines = str(err).strip().splitlines()
    return lines[-1].strip() if lines else type(err).__name__

"""Atomic, verified ``torch.distributed.checkpoint`` save and resume of a whole run.

The run's state is registered once, as ``Stateful`` objects: the model and optimizer
(:class:`ModelAndOptimizer`), the step (:class:`Progress`) and the data position, all saved
through DCP (sharded or not, so a checkpoint resumes at another world
size), and each rank's RNG (:class:`RankRNG`, restored at the same world size only).
A checkpoint is ``<run>/checkpoints/step_<N>/``. It is written as ``step_<N>.tmp`` and
renamed only after every rank finished and rank 0 wrote ``manifest.json`` (size and CRC-32 of
every file), so a crash during a save never leaves a newest checkpoint that looks complete.
Resume verifies the manifest and falls back, with a warning, past a corrupt checkpoint.

An asynchronous save (``save(step, asynchronous=True)``) copies the state into CPU memory and
returns; DCP writes the copy from a background thread (``dcp.async_save``, over a gloo group of
its own, so its collectives never interleave with training's), and rank 0 then writes the
manifest there too (inside ``step_<N>.tmp`` it makes no checkpoint). The loop calls
:meth:`Checkpointer.commit_pending` after the next step: the ranks wait for what is left of the
write and commit it together (rename; pruning in the background), as a synchronous save does.
So a checkpoint of step N is always committed after step N + 1 (a restart never loses more than
one extra step to it), and training stalls only where a write takes longer than a step.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.checkpoint.stateful import Stateful

from trainers.core.distributed import DistEnv
from trainers.torchfree.checkpoint_files import (
    CHECKPOINTS,
    FORMAT,
    MANIFEST,
    PREFIX,
    check_format,
    crc32,
    find_checkpoints,
    verify,
)
from trainers.torchfree.errors import CheckpointWriteError, ConfigError
from trainers.torchfree.faults import KillPoint, maybe_kill

log = logging.getLogger(__name__)

# Optimizer state and hyper-parameters keyed by parameter name: ranks holding different
# parameters (pipeline stages) then never write the same key with different contents.
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


class ModelAndOptimizer(Stateful):
    """Model and optimizer through DCP's state-dict API (sharded, keyed by parameter name)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=_OPTIONS)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=_OPTIONS)


class Progress(Stateful):
    """The optimizer steps a run has taken."""

    def __init__(self, step: int = 0) -> None:
        self.step = step

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


class RankRNG(Stateful):
    """This process's torch (and CUDA) RNG: dropout's stream, one per rank."""

    def state_dict(self) -> dict[str, Any]:
        state = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])


def _write_failure(err: BaseException, folder: Path) -> str:
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


# What a failed write raises: an OS error, a storage error, or DCP's collected failures.
_WRITE_ERRORS = (OSError, RuntimeError, CheckpointException)


@dataclass
class _Write:
    """Checkpoint ``step`` being written into ``folder`` (``step_<N>.tmp``) on this rank.

    ``written`` completes once every rank's DCP write finished (DCP ends a save with a collective
    that every rank reaches after its own files, which it writes after its per-rank state) and,
    on rank 0, ``manifest.json`` is written too. ``failure`` is a write error of this rank that
    happened before DCP's write could start; then ``written`` is None."""

    step: int
    folder: Path
    written: Future[None] | None
    failure: str = ""


def _write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """``manifest`` plus the size and CRC-32 of every file of ``folder``, as ``manifest.json``
    there, on disk before it returns. Still inside ``step_<N>.tmp``, it makes no checkpoint:
    that takes the rename, after every rank's write succeeded."""
    files = {p.name: [p.stat().st_size, crc32(p)] for p in sorted(folder.iterdir())}
    with open(folder / MANIFEST, "w") as f:
        json.dump({**manifest, "files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _when_written(upload: Future[Any], folder: Path, manifest: dict[str, Any] | None) -> None:
    """Wait for DCP's ``upload``; rank 0 (``manifest`` given) then writes the manifest."""
    upload.result()
    if manifest is not None:
        _write_manifest(folder, manifest)


def _completed(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


class Checkpointer:
    """Saves and resumes the run in ``run_dir``, keeping the ``keep`` newest checkpoints.

    ``run_config`` (the run's TrainConfig as a dict) goes into every manifest, so a checkpoint
    alone says how to rebuild its model (``trainers.sample``, ``trainers.export``); so do the
    ``facts`` the run keeps across attempts (a dict the loop updates; read at each save).
    ``state`` maps names to the Stateful objects every checkpoint holds (saved through DCP,
    the same on every rank or sharded); ``rank_state`` to those private to each rank (saved per
    rank, restored only at the world size they were saved at).

    At most one save is in flight. :meth:`close` (after the last save, also after an error)
    releases the background thread and the staging buffers.
    """

    def __init__(self, run_dir: Path, keep: int, env: DistEnv, run_config: dict[str, Any],
                 state: dict[str, Stateful], rank_state: dict[str, Stateful] | None = None,
                 kill_at: KillPoint | None = None, facts: dict[str, Any] | None = None) -> None:
        self.state = state
        self.facts = facts if facts is not None else {}
        self.rank_state = rank_state or {}
        self.run_dir = run_dir
        self.folder = run_dir / CHECKPOINTS
        self.keep = keep
        self.env = env
        self.run_config = run_config
        self.kill_at = kill_at
        self._pending: _Write | None = None
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        # Created on the first asynchronous save (collective: every rank saves the same steps).
        self._group: dist.ProcessGroup | None = None
        self._stager: DefaultStager | None = None

    def save(self, step: int, asynchronous: bool = False) -> Path | None:
        """Write checkpoint ``step`` of the registered state (collective: every rank calls it)
        after committing the save in flight, if any.

        Synchronous: returns the committed checkpoint. Asynchronous: returns None once the state
        is copied to CPU memory; :meth:`commit_pending` commits it later."""
        self.commit_pending()
        write = self._start(step, asynchronous)
        if asynchronous:
            self._pending = write
            return None
        return self._commit(write, prune_in_background=False)

    def commit_pending(self) -> Path | None:
        """Commit the asynchronous save in flight, if any, once every rank's write finished
        (waiting for the rest of it); return the committed checkpoint (collective: the loop
        calls it at the end of every step, so a save is committed one step after its own).

        Raises CheckpointWriteError when a rank's write failed."""
        write, self._pending = self._pending, None
        if write is None:
            return None
        committed = self._commit(write, prune_in_background=True)
        if self.env.is_main:
            log.info("checkpoint %s committed (written in the background)", committed)
        return committed

    def close(self) -> None:
        """Release the background thread and the staging buffers (a write still in flight is
        left uncommitted: its ``step_<N>.tmp`` never counts as a checkpoint)."""
        self._background.shutdown(wait=False, cancel_futures=True)
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    def _start(self, step: int, asynchronous: bool) -> _Write:
        """Begin writing checkpoint ``step`` into ``step_<N>.tmp``: this rank's own state first,
        then DCP's shards (always called, so every rank joins DCP's collectives)."""
        final = self.folder / f"{PREFIX}{step:08d}"
        tmp = final.with_name(final.name + ".tmp")
        if self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        failure = ""
        try:
            torch.save({name: s.state_dict() for name, s in self.rank_state.items()},
                       self._rank_file(tmp))
        except _WRITE_ERRORS as err:
            failure = _write_failure(err, self.folder)
        try:
            if asynchronous:
                # Staged synchronously (a CPU copy), so the Future is DCP's upload alone.
                upload = dcp.async_save(self.state, checkpoint_id=tmp,
                                        process_group=self._checkpoint_group(),
                                        async_checkpointer_type=AsyncCheckpointerType.THREAD,
                                        async_stager=self._staging())
            else:
                upload = _completed(dcp.save(self.state, checkpoint_id=tmp))
        except _WRITE_ERRORS as err:
            return _Write(step, tmp, None, failure or _write_failure(err, self.folder))
        manifest = {"format": FORMAT, "step": step, "model": self.run_config["model"],
                    "world_size": self.env.world_size, "config": self.run_config,
                    "run": dict(self.facts)}
        written = self._background.submit(_when_written, upload, tmp,
                                          manifest if self.env.is_main else None)
        return _Write(step, tmp, written, failure)

    def _checkpoint_group(self) -> dist.ProcessGroup:
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        return self._group

    def _staging(self) -> DefaultStager:
        """One stager for the run: it keeps its CPU buffers and refills them at every save."""
        if self._stager is None:
            self._stager = DefaultStager(StagingOptions(
                use_pinned_memory=torch.cuda.is_available(), use_shared_memory=False,
                use_async_staging=False, use_non_blocking_copy=False))
        return self._stager

    def _commit(self, write: _Write, prune_in_background: bool) -> Path:
        """Wait for ``write``; if every rank's succeeded, rank 0 renames ``step_<N>.tmp`` (with
        its manifest) to ``step_<N>`` and prunes to the ``keep`` newest, in the background if
        ``prune_in_background`` (the next write waits for it) (collective)."""
        failure = write.failure
        if write.written is not None:
            try:
                write.written.result()
            except _WRITE_ERRORS as err:
                failure = failure or _write_failure(err, self.folder)
        maybe_kill(self.kill_at, "save", self.env.rank, write.step, self.run_dir)
        failures: list[str] = [""] * self.env.world_size
        dist.all_gather_object(failures, failure)
        if any(failures):
            if self.env.is_main:
                shutil.rmtree(write.folder, ignore_errors=True)
            previous = find_checkpoints(self.folder)
            raise CheckpointWriteError(
                f"checkpoint step {write.step} could not be written to {self.folder} "
                f"({next(f for f in failures if f)}); "
                + (f"{previous[0].name} is intact and a restart resumes from it"
                   if previous else "no earlier checkpoint exists")
                + "; free space there, lower --keep-checkpoints or pass another --output-dir")
        final = write.folder.with_name(write.folder.name.removesuffix(".tmp"))
        if self.env.is_main:
            if final.exists():
                shutil.rmtree(final)
            os.replace(write.folder, final)
            _fsync_dir(self.folder)
            if prune_in_background:
                self._background.submit(self._prune)
            else:
                self._prune()
        dist.barrier()
        return final

    def _prune(self) -> None:
        """Delete all but the ``keep`` newest checkpoints."""
        for old in find_checkpoints(self.folder)[self.keep:]:
            shutil.rmtree(old, ignore_errors=True)

    def choose(self, resume: str) -> Path | None:
        """The checkpoint ``resume`` names (auto, none or a path); rank 0 decides for all."""
        choice: list[Path | None | str] = [None]
        if self.env.is_main:
            try:
                choice[0] = self._choose_here(resume)
            except ConfigError as err:
                choice[0] = f"error: {err}"
        dist.broadcast_object_list(choice, src=0)
        if isinstance(choice[0], str):
            raise ConfigError(choice[0][len("error: "):])
        return choice[0]

    def _choose_here(self, resume: str) -> Path | None:
        if resume == "none":
            return None
        candidates = find_checkpoints(self.folder if resume == "auto" else Path(resume))
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
            log.warning("checkpoint %s is corrupt (%s); falling back to an older one",
                        path, problem)
        raise ConfigError(f"--resume {resume}: every checkpoint is corrupt (newest: "
                          f"{candidates[0]}); pass --resume none with a new --output-dir")

    def _rank_file(self, checkpoint: Path) -> Path:
        return checkpoint / f"rank_state{self.env.rank}.pt"

    def load(self, path: Path) -> None:
        """Restore the registered state from checkpoint ``path``; the per-rank state only if it
        was saved at this world size."""
        dcp.load(self.state, checkpoint_id=path)
        rank_file = self._rank_file(path)
        saved_world = json.loads((path / MANIFEST).read_text())["world_size"]
        if saved_world == self.env.world_size and rank_file.exists():
            saved = torch.load(rank_file, weights_only=True)
            for name, stateful in self.rank_state.items():
                stateful.load_state_dict(saved[name])
        elif self.env.is_main:
            log.warning("resuming %d ranks from a %d-rank checkpoint: RNG streams restart from "
                        "the seed", self.env.world_size, saved_world)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

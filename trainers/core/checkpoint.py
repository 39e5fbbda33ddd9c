"""Verified ``torch.distributed.checkpoint`` save and resume of a whole run, on disk or on an
object store: the collective protocol of :class:`Checkpointer`.

The run's state is registered once, as ``Stateful`` objects
(:mod:`trainers.core.checkpoint_state`: model and optimizer, step; the data position), all
saved through DCP (sharded or not, so a checkpoint resumes at another world size), and each
rank's private state (its RNG, restored at the same world size only). Every file operation
outside DCP's shards is in :mod:`trainers.core.checkpoint_storage`.
A checkpoint is ``<run>/checkpoints/step_<N>/`` (a prefix of a bucket for an ``s3://`` run).
Every rank writes straight into it; only after every rank finished does rank 0 write
``manifest.json`` (size and checksum of every file), the commit marker, so a crash during a
save never leaves a newest checkpoint that looks complete, and no rename is needed (object
stores have none). Resume verifies the manifest and falls back, with a warning, past a
corrupt checkpoint.

An asynchronous save (``save(step, asynchronous=True)``) copies the state into CPU memory and
returns; DCP writes the copy from a background thread (``dcp.async_save``, over a gloo group of
its own, so its collectives never interleave with training's). The loop calls
:meth:`Checkpointer.commit_pending` after the next step: the ranks wait for what is left of the
write and commit it together (the manifest; pruning in the background), as a synchronous save
does. So a checkpoint of step N is always committed after step N + 1 (a restart never loses
more than one extra step to it), and training stalls only where a write takes longer than a
step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.checkpoint.stateful import Stateful

from trainers.core import checkpoint_storage as storage
from trainers.core.distributed import DistEnv
from trainers.errors import CheckpointWriteError, ConfigError
from trainers.runs.checkpoint_files import CHECKPOINTS, FORMAT, find_checkpoints
from trainers.runs.faults import KillPoint, maybe_kill
from trainers.runs.storage import RunPath

# torch 2.11 and 2.12's DefaultStager closes its own state-dict stager at the end of every stage,
# which empties the stager's copy table: its next stage fails (KeyError: <class 'type'>) and
# its CPU buffers are dropped anyway. There one stager serves one save; 2.13 keeps them.
STAGER_SERVES_ONE_SAVE = (2, 11) <= torch.torch_version.TorchVersion(torch.__version__) < (2, 13)

log = logging.getLogger(__name__)


@dataclass
class _Write:
    """Checkpoint ``step`` being written into ``folder`` (``step_<N>``) on this rank.

    ``written`` completes once every rank's DCP write finished (DCP ends a save with a collective
    that every rank reaches after its own files, which it writes after its per-rank state).
    ``manifest`` is what rank 0 commits it with (None on the other ranks). ``failure`` is a
    write error of this rank that happened before DCP's write could start; then ``written`` is
    None."""

    step: int
    folder: RunPath
    written: Future[Any] | None
    manifest: dict[str, Any] | None
    failure: str = ""


def _completed(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


class Checkpointer:
    """Saves and resumes the run in ``run_dir``, keeping the ``keep`` newest checkpoints.

    ``run_config`` (the run's TrainConfig as a dict) goes into every manifest, so a checkpoint
    alone says how to rebuild its model (``trainers.tools.sample``, ``trainers.tools.export``);
    so do the facts the run keeps across attempts (what ``facts`` returns, asked at each save).
    ``state`` maps names to the Stateful objects every checkpoint holds (saved through DCP,
    the same on every rank or sharded); ``rank_state`` to those private to each rank (saved per
    rank, restored only at the world size they were saved at).

    At most one save is in flight. :meth:`close` (after the last save, also after an error)
    releases the background thread and the staging buffers.
    """

    def __init__(self, run_dir: RunPath, keep: int, env: DistEnv, run_config: dict[str, Any],
                 state: dict[str, Stateful], rank_state: dict[str, Stateful] | None = None,
                 kill_at: KillPoint | None = None,
                 facts: Callable[[], dict[str, Any]] | None = None) -> None:
        self.state = state
        self.facts = facts or dict
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

    def save(self, step: int, asynchronous: bool = False) -> RunPath | None:
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

    def commit_pending(self) -> RunPath | None:
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
        left uncommitted: a ``step_<N>`` without a manifest never counts as a checkpoint)."""
        self._background.shutdown(wait=False, cancel_futures=True)
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    def _start(self, step: int, asynchronous: bool) -> _Write:
        """Begin writing checkpoint ``step`` into ``step_<N>``: this rank's own state first,
        then DCP's shards (always called, so every rank joins DCP's collectives)."""
        target = storage.checkpoint_path(self.folder, step)
        if self.env.is_main:
            storage.prepare(target)
        dist.barrier()
        manifest = ({"format": FORMAT, "step": step, "model": self.run_config["model"],
                     "world_size": self.env.world_size, "config": self.run_config,
                     "run": self.facts()} if self.env.is_main else None)
        failure = ""
        try:
            storage.write_rank_state(target, self.env.rank,
                                     {name: s.state_dict() for name, s in self.rank_state.items()})
        except storage.WRITE_ERRORS as err:
            failure = storage.write_failure(err, self.folder)
        maybe_kill(self.kill_at, "upload", self.env.rank, step, self.run_dir)
        checkpoint_id = storage.dcp_checkpoint_id(target)
        writer = storage.dcp_writer(target)
        try:
            if asynchronous:
                # Staged synchronously (a CPU copy), so the Future is DCP's upload alone.
                upload = dcp.async_save(self.state, checkpoint_id=checkpoint_id,
                                        storage_writer=writer,
                                        process_group=self._checkpoint_group(),
                                        async_checkpointer_type=AsyncCheckpointerType.THREAD,
                                        async_stager=self._staging())
            else:
                upload = _completed(dcp.save(self.state, checkpoint_id=checkpoint_id,
                                             storage_writer=writer))
        except storage.WRITE_ERRORS as err:
            return _Write(step, target, None, manifest,
                          failure or storage.write_failure(err, self.folder))
        return _Write(step, target, upload, manifest, failure)

    def _checkpoint_group(self) -> dist.ProcessGroup:
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        return self._group

    def _staging(self) -> DefaultStager:
        """One stager for the run: it keeps its CPU buffers and refills them at every save
        (where the torch closes it after each save, :data:`STAGER_SERVES_ONE_SAVE`: a new one
        for each save)."""
        if self._stager is not None and STAGER_SERVES_ONE_SAVE:
            self._stager.close()
            self._stager = None
        if self._stager is None:
            self._stager = DefaultStager(StagingOptions(
                use_pinned_memory=torch.cuda.is_available(), use_shared_memory=False,
                use_async_staging=False, use_non_blocking_copy=False))
        return self._stager

    def _commit(self, write: _Write, prune_in_background: bool) -> RunPath:
        """Wait for ``write``; if every rank's succeeded, rank 0 commits ``step_<N>`` (writes its
        manifest) and prunes to the ``keep`` newest, in the background if
        ``prune_in_background`` (the next write waits for it) (collective)."""
        failure = write.failure
        if write.written is not None:
            try:
                write.written.result()
            except storage.WRITE_ERRORS as err:
                failure = failure or storage.write_failure(err, self.folder)
        maybe_kill(self.kill_at, "save", self.env.rank, write.step, self.run_dir)
        failures: list[str] = [""] * self.env.world_size
        dist.all_gather_object(failures, failure)
        if any(failures):
            if self.env.is_main:
                storage.remove(write.folder)
            previous = find_checkpoints(self.folder)
            raise CheckpointWriteError(
                f"checkpoint step {write.step} could not be written to {self.folder} "
                f"({next(f for f in failures if f)}); "
                + (f"{previous[0].name} is intact and a restart resumes from it"
                   if previous else "no earlier checkpoint exists")
                + "; free space there, lower --keep-checkpoints or pass another --output-dir")
        committed = [""]
        if self.env.is_main:
            try:
                storage.commit(write.folder, write.manifest or {})
            except storage.WRITE_ERRORS as err:
                committed[0] = storage.write_failure(err, self.folder)
        dist.broadcast_object_list(committed, src=0)
        if committed[0]:
            raise CheckpointWriteError(f"checkpoint step {write.step} could not be committed "
                                       f"in {self.folder} ({committed[0]}); pass another "
                                       "--output-dir")
        if self.env.is_main:
            if prune_in_background:
                self._background.submit(storage.prune, self.folder, self.keep)
            else:
                storage.prune(self.folder, self.keep)
        return write.folder

    def choose(self, resume: str) -> RunPath | None:
        """The checkpoint ``resume`` names (auto, none, a path or URL); rank 0 decides for all."""
        choice: list[RunPath | None | str] = [None]
        if self.env.is_main:
            try:
                choice[0] = storage.find_resumable(resume, self.folder)
            except ConfigError as err:
                choice[0] = f"error: {err}"
        dist.broadcast_object_list(choice, src=0)
        if isinstance(choice[0], str):
            raise ConfigError(choice[0][len("error: "):])
        return choice[0]

    def load(self, path: RunPath) -> None:
        """Restore the registered state from checkpoint ``path``; the per-rank state only if it
        was saved at this world size."""
        dcp.load(self.state, checkpoint_id=storage.dcp_checkpoint_id(path))
        saved_world = storage.saved_world_size(path)
        saved = (storage.read_rank_state(path, self.env.rank)
                 if saved_world == self.env.world_size else None)
        if saved is not None:
            for name, stateful in self.rank_state.items():
                stateful.load_state_dict(saved[name])
        elif self.env.is_main:
            log.warning("resuming %d ranks from a %d-rank checkpoint: RNG streams restart from "
                        "the seed", self.env.world_size, saved_world)

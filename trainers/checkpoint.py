"""Atomic, verified ``torch.distributed.checkpoint`` save and resume of a whole run.

A checkpoint is ``<run>/checkpoints/step_<N>/``: the DCP files of the model and optimizer
(sharded or not, so a checkpoint resumes at another world size), the loop state (step, LR
schedule, data position) and each rank's RNG state. It is written as ``step_<N>.tmp`` and
renamed only after every rank finished and rank 0 wrote ``manifest.json`` (size and CRC-32 of
every file), so a crash during a save never leaves a newest checkpoint that looks complete.
Resume verifies the manifest and falls back, with a warning, past a corrupt checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from trainers.checkpoint_files import (
    CHECKPOINTS,
    MANIFEST,
    PREFIX,
    crc32,
    find_checkpoints,
    verify,
)
from trainers.distributed import DistEnv
from trainers.errors import CheckpointWriteError, ConfigError
from trainers.faults import KillPoint, maybe_kill

log = logging.getLogger(__name__)

# Optimizer state and hyper-parameters keyed by parameter name: ranks holding different
# parameters (pipeline stages) then never write the same key with different contents.
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


class _TrainState(Stateful):
    """Model and optimizer through DCP's state-dict API, plus the loop's own state."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 loop_state: dict[str, Any]) -> None:
        self.model, self.optimizer, self.loop_state = model, optimizer, loop_state

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=_OPTIONS)
        return {"model": model_sd, "optim": optim_sd, "loop": self.loop_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=_OPTIONS)
        self.loop_state.update(state["loop"])


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


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class Checkpointer:
    """Saves and resumes the run in ``run_dir``, keeping the ``keep`` newest checkpoints."""

    def __init__(self, run_dir: Path, keep: int, env: DistEnv, model_name: str,
                 kill_at: KillPoint | None = None) -> None:
        self.run_dir = run_dir
        self.folder = run_dir / CHECKPOINTS
        self.keep = keep
        self.env = env
        self.model_name = model_name
        self.kill_at = kill_at

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
             loop_state: dict[str, Any]) -> Path:
        """Write checkpoint ``step`` (collective: every rank calls it)."""
        final = self.folder / f"{PREFIX}{step:08d}"
        tmp = final.with_name(final.name + ".tmp")
        if self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        failure = ""
        try:
            dcp.save({"train": _TrainState(model, optimizer, loop_state)}, checkpoint_id=tmp)
            torch.save(_rng_state(), tmp / f"rng_rank{self.env.rank}.pt")
        except (OSError, RuntimeError, CheckpointException) as err:
            failure = _write_failure(err, self.folder)
        maybe_kill(self.kill_at, "save", self.env.rank, step, self.run_dir)
        failures: list[str] = [""] * self.env.world_size
        dist.all_gather_object(failures, failure)
        if any(failures):
            if self.env.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            previous = find_checkpoints(self.folder)
            raise CheckpointWriteError(
                f"checkpoint step {step} could not be written to {self.folder} "
                f"({next(f for f in failures if f)}); "
                + (f"{previous[0].name} is intact and a restart resumes from it"
                   if previous else "no earlier checkpoint exists")
                + "; free space there, lower --keep-checkpoints or pass another --output-dir")
        dist.barrier()
        if self.env.is_main:
            files = {p.name: [p.stat().st_size, crc32(p)] for p in sorted(tmp.iterdir())}
            manifest = {"step": step, "model": self.model_name,
                        "world_size": self.env.world_size, "files": files}
            with open(tmp / MANIFEST, "w") as f:
                json.dump(manifest, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            _fsync_dir(self.folder)
            for old in find_checkpoints(self.folder)[self.keep:]:
                shutil.rmtree(old, ignore_errors=True)
        dist.barrier()
        return final

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
                return path
            log.warning("checkpoint %s is corrupt (%s); falling back to an older one",
                        path, problem)
        raise ConfigError(f"--resume {resume}: every checkpoint is corrupt (newest: "
                          f"{candidates[0]}); pass --resume none with a new --output-dir")

    def load(self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
             loop_state: dict[str, Any]) -> None:
        """Restore model, optimizer, ``loop_state`` and (same world size) this rank's RNG."""
        dcp.load({"train": _TrainState(model, optimizer, loop_state)}, checkpoint_id=path)
        rng_file = path / f"rng_rank{self.env.rank}.pt"
        saved_world = json.loads((path / MANIFEST).read_text())["world_size"]
        if saved_world == self.env.world_size and rng_file.exists():
            _set_rng_state(torch.load(rng_file, weights_only=True))
        elif self.env.is_main:
            log.warning("resuming %d ranks from a %d-rank checkpoint: RNG streams restart from "
                        "the seed", self.env.world_size, saved_world)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

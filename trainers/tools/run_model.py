"""A run's model, rebuilt in one process from its checkpoint, whichever trainer wrote it.

Every checkpoint's manifest holds the run's config and its DCP files hold the model's entries
under ``train.model.<parameter name>`` with the model's own names, sharded or not; loading
them into a single-process model reads and joins the shards (no process group is needed).
:func:`load_run_model` is the one place that turns a run into a model. A run is a local
directory or, from :func:`trainers.runs.storage.location`, a bucket URL, which DCP reads
through its fsspec reader.
"""

from __future__ import annotations

import json
import logging
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from trainers.core.checkpoint_storage import dcp_checkpoint_id
from trainers.errors import ConfigError
from trainers.models import allocate, materialize
from trainers.models.run_spec import run_spec
from trainers.runs.checkpoint_files import (
    MANIFEST,
    PREFIX,
    check_format,
    find_checkpoints,
    verify,
)
from trainers.runs.storage import RunPath

log = logging.getLogger(__name__)


def pick_checkpoint(path: RunPath, step: int | None = None) -> RunPath:
    """The checkpoint at ``path`` (a run, its checkpoints/ or one step_N): the one of ``step``,
    else the newest intact one (corrupt newer ones are skipped with a warning).

    Raises ConfigError when there is no such checkpoint or none is intact.
    """
    candidates = find_checkpoints(path)
    if not candidates:
        raise ConfigError(f"{path}: no checkpoint there; pass a run directory holding "
                          "checkpoints/step_* or a step_* directory")
    if step is not None:
        chosen = [p for p in candidates if int(p.name[len(PREFIX):]) == step]
        if not chosen:
            steps = ", ".join(str(int(p.name[len(PREFIX):])) for p in candidates)
            raise ConfigError(f"{path}: no checkpoint of step {step}; its steps are {steps}")
        candidates = chosen
    for checkpoint in candidates:
        problem = verify(checkpoint)
        if problem is None:
            return checkpoint
        log.warning("checkpoint %s is corrupt (%s); skipping it", checkpoint, problem)
    raise ConfigError(f"{path}: no intact checkpoint (newest: {candidates[0].name}); "
                      "pass another run or --checkpoint step")


def run_config(checkpoint: RunPath) -> dict[str, Any]:
    """The run's TrainConfig (as a dict) from the manifest of ``checkpoint``; ConfigError if the
    checkpoint is of another format or predates configs in manifests."""
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    check_format(checkpoint, manifest)
    if "config" not in manifest:
        raise ConfigError(f"{checkpoint}: its manifest holds no run config (written by an "
                          "earlier version of these trainers); train the run again to sample "
                          "or export it")
    return manifest["config"]


@torch.no_grad()
def load_run_model(run_or_checkpoint: RunPath,
                   step: int | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """The model of a run on the CPU in eval mode with the weights of its checkpoint
    (:func:`pick_checkpoint`: a step_N directory, the run's of ``step``, else its newest intact
    one), and the run's config as a dict. A LoRA run's base is rebuilt as it trained (its
    seed, ``hf:DIR``'s weights) and its adapters come from the checkpoint.

    Raises ConfigError for a path without such an intact checkpoint of the current format.
    """
    checkpoint = pick_checkpoint(run_or_checkpoint, step)
    config = run_config(checkpoint)
    spec = run_spec(config)
    model = spec.meta_model()
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    if frozen:  # a LoRA run: the base comes back from where it came from, the adapters load
        materialize(model, torch.device("cpu"), config["seed"], spec)
    else:
        allocate(model, torch.device("cpu"), spec)  # every parameter is loaded next
    weights = {name: t for name, t in model.state_dict().items()
               if name not in spec.shared_parameters and name not in frozen}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single")
        dcp.load({"train": {"model": weights}}, checkpoint_id=dcp_checkpoint_id(checkpoint),
                 no_dist=True)
    return model.eval(), config

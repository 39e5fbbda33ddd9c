"""The spec of the model a run trains: the family ``--model`` names
(:func:`trainers.models.registry.resolve_spec`), adapted for ``--lora-rank``
(:func:`trainers.models.lora.lora_from_options`). Every trainer resolves it once
(:func:`trainers.core.entry.train_in_group`); a run rebuilt from its directory resolves it from
the recorded options (:func:`trainers.tools.run_model.load_run_model`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from trainers.models.lora import lora_from_options
from trainers.models.protocol import ModelSpec
from trainers.models.registry import family_key, resolve_spec
from trainers.options.train_config import TrainConfig


def run_spec(options: Mapping[str, Any], frozen_dtype: torch.dtype = torch.float32) -> ModelSpec:
    """The spec of the model a run trains from its options (a ``TrainConfig`` as a dict, or
    the config in a checkpoint's manifest), with adapters when ``lora_rank`` > 0 (the frozen
    linear layers in ``frozen_dtype``)."""
    spec = resolve_spec(options["model"], options["dropout"], options["attention"],
                        options["attention_window"])
    return lora_from_options(spec, family_key(options["model"]), options, frozen_dtype)


def spec_of(cfg: TrainConfig) -> ModelSpec:
    """The spec of the model ``cfg`` trains (:func:`run_spec`): under ``--dtype bf16`` the
    frozen base's linear layers are held in bf16."""
    return run_spec(cfg.to_dict(), torch.bfloat16 if cfg.dtype == "bf16" else torch.float32)

"""Weights for a model built on the meta device, identical under every trainer and world size.

A trainer builds its model under ``torch.device("meta")`` (shapes, no memory), applies its
parallelism (tensor parallel, activation checkpointing, FSDP, the pipeline split: each keeps
the meta parameters, now sharded or split), and only then allocates and fills what this rank
holds. :func:`materialize` fills each parameter from a generator seeded by the run's seed and
the parameter's name, generating the whole tensor and keeping this rank's shard, one parameter
at a time: a rank's memory at the end of setup is its shards plus the largest parameter, and
every rank of every trainer agrees with the single-process model.

The model's spec (:class:`trainers.models.protocol.ModelSpec`) supplies
``init_parameter(name, value, generator)`` (fill the whole parameter ``name`` in place) and
``shared_parameters`` (names that alias another parameter, as a tied head does, mapped to that
one's name) and, for a model with buffers, ``init_buffers(model)``. :func:`build_model` is the
whole path for one process: ``--model`` name -> spec -> meta model -> weights on a device.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_PREFIX
from torch.distributed.tensor import DTensor, distribute_tensor

from trainers.models.protocol import ModelSpec
from trainers.models.registry import resolve_spec


def parameter_name(name: str, shared: Mapping[str, str]) -> str:
    """The model's own name of parameter ``name``: wrapper prefixes (activation checkpointing)
    removed and aliases resolved, so every trainer seeds a parameter alike."""
    name = name.replace(_CHECKPOINT_PREFIX, "")
    return shared.get(name, name)


def parameter_seed(seed: int, name: str) -> int:
    """The generator seed of parameter ``name`` in a run seeded with ``seed``."""
    return zlib.crc32(f"{seed}/{name}".encode())


def _tie(model: nn.Module, shared: Mapping[str, str]) -> None:
    """Point each alias in ``shared`` at its parameter again: allocating a meta model
    (``to_empty``) gives every module a parameter of its own. An alias whose module or target
    this part of the model lacks (a pipeline stage) is left alone."""
    for alias, target in shared.items():
        owner, _, attribute = alias.rpartition(".")
        try:
            module, parameter = model.get_submodule(owner), model.get_parameter(target)
        except AttributeError:
            continue
        setattr(module, attribute, parameter)


@torch.no_grad()
def allocate(model: nn.Module, device: torch.device, spec: ModelSpec) -> None:
    """Allocate ``model`` (the model of ``spec``, built on the meta device) on ``device`` with
    its shared parameters tied and its buffers filled, its parameters left uninitialized (for
    a caller that loads every one, e.g. from a checkpoint)."""
    model.to_empty(device=device)
    _tie(model, spec.shared_parameters)
    if spec.init_buffers is not None:
        spec.init_buffers(model)


@torch.no_grad()
def materialize(model: nn.Module, device: torch.device | None, seed: int,
                spec: ModelSpec) -> None:
    """Allocate ``model``'s parameters (the model of ``spec``, or a part of it) on ``device``
    (None: leave them where they are, e.g. already placed on several devices), tie its shared
    parameters, and give each parameter the initial value of the whole model's parameter of
    its name, sharded as the parameter is (a parameter held in bf16: the bf16 rounding of
    the fp32 value)."""
    if device is not None:
        model.to_empty(device=device)
    shared = spec.shared_parameters
    _tie(model, shared)
    for raw_name, param in model.named_parameters():
        name = parameter_name(raw_name, shared)
        generator = torch.Generator(device=param.device).manual_seed(parameter_seed(seed, name))
        # A parameter held narrower than fp32 (LoRA's frozen bf16 base) gets the rounding of
        # its fp32 initial value.
        whole = torch.empty(param.shape, dtype=torch.promote_types(param.dtype, torch.float32),
                            device=param.device)
        spec.init_parameter(name, whole, generator)
        if isinstance(param, DTensor):
            # Every rank holds the same whole tensor, so each cuts out its own shard (no
            # communication: src_data_rank=None).
            shard = distribute_tensor(whole, param.device_mesh, param.placements,
                                      src_data_rank=None)
            param.to_local().copy_(shard.to_local())
        else:
            param.copy_(whole)
        del whole
    if spec.init_buffers is not None:
        spec.init_buffers(model)


def build_model(name: str, dropout: float = 0.0, attention: str = "sdpa",
                attention_window: int = 256, seed: int | None = None,
                device: torch.device | str = "cpu") -> nn.Module:
    """The model ``--model name`` names, built on the meta device and materialized on
    ``device`` with the weights every trainer gives it for ``seed`` (default: the seed torch
    was last seeded with). Raises ValueError for an unknown attention, a window < 1, or
    dropout > 0 with an attention other than ``sdpa``."""
    spec = resolve_spec(name, dropout, attention, attention_window)
    model = spec.meta_model()
    materialize(model, torch.device(device), torch.initial_seed() if seed is None else seed,
                spec)
    return model

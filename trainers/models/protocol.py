"""The model-spec protocol: everything the trainers need to know about a model.

Every trainer (ddp, fsdp, tensor_parallel, pipeline, model_parallel) and Ray Train work from a
:class:`ModelSpec`, never from attribute names of one model. A spec says

* ``shape``: the shape facts (:class:`trainers.sizing.shapes.ModelConfig`) the planner, MFU and
  the pre-flight checks read;
* ``build()``: the model, called under ``torch.device("meta")``; its forward takes token ids
  ``(batch, seq)`` and returns logits ``(batch, seq, vocab)``;
* ``blocks``: the dotted path of the ``ModuleDict``/``ModuleList`` of repeated blocks (FSDP
  units, activation checkpointing, pipeline stages, devices of the model-parallel spread);
* ``init_parameter(name, value, generator)``: fill the whole parameter ``name`` in place with
  its initial value (see :mod:`trainers.models.weights`); ``shared_parameters``: parameters
  that are another one under a second name (a tied head), mapped to that one's name;
  ``init_buffers(model)`` (optional): fill the buffers of the allocated model (rotary tables);
* ``tp_plan(sequence_parallel)`` (optional): one block's tensor-parallel plan, submodule path
  -> ``ParallelStyle``, as ``parallelize_module`` takes it; without one ``--tp`` > 1 is refused;
* ``first``/``last``: the modules outside the blocks that only the first (input side) and the
  last (output side) pipeline stage hold. With ``shape.pipeline`` the model's forward skips
  the ones set to None and then takes or returns hidden states (a stage of the model).

This module is the leaf of :mod:`trainers.models`: it imports torch and the torch-free layers
only. The families that make specs register in :mod:`trainers.models.registry`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from trainers.sizing.shapes import FAMILIES, ModelConfig

ParameterInit = Callable[[str, torch.Tensor, torch.Generator], None]
TensorParallelPlan = Callable[[bool], dict[str, object]]


@dataclass(frozen=True)
class ModelSpec:
    """How the trainers build, initialize and parallelize one model (see the module doc)."""

    shape: ModelConfig
    build: Callable[[], nn.Module]
    init_parameter: ParameterInit
    blocks: str = "blocks"
    shared_parameters: Mapping[str, str] = field(default_factory=dict)
    tp_plan: TensorParallelPlan | None = None
    first: tuple[str, ...] = ()
    last: tuple[str, ...] = ()
    init_buffers: Callable[[nn.Module], None] | None = None

    def __post_init__(self) -> None:
        if self.tp_plan is None and self.shape.tensor_parallel:
            object.__setattr__(self, "shape",
                               dataclasses.replace(self.shape, tensor_parallel=False))
        if self.shape.pipeline and not (self.first and self.last):
            object.__setattr__(self, "shape", dataclasses.replace(self.shape, pipeline=False))
        if self.shape.family not in FAMILIES and not self.shape.params:
            object.__setattr__(self, "shape", dataclasses.replace(
                self.shape, params=counted_params(self)))

    def meta_model(self) -> nn.Module:
        """The model on the meta device: shapes only, no memory."""
        with torch.device("meta"):
            return self.build()

    def block_container(self, model: nn.Module) -> nn.ModuleDict | nn.ModuleList:
        """The container of ``model``'s repeated blocks."""
        return model.get_submodule(self.blocks)

    def named_blocks(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        """``(key, block)`` of the blocks ``model`` holds, in order."""
        return list(self.block_container(model).named_children())


def counted_params(spec: ModelSpec) -> int:
    """The parameter count of ``spec``'s model, built on the meta device (shared ones once)."""
    return sum(p.numel() for p in spec.meta_model().parameters())

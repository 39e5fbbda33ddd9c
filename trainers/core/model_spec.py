"""The model-spec protocol: everything the trainers need to know about a model.

Every trainer (ddp, fsdp, tensor_parallel, pipeline, model_parallel) and Ray Train work from a
:class:`ModelSpec`, never from attribute names of one model. A spec says

* ``shape``: the shape facts (:class:`trainers.torchfree.shapes.ModelConfig`) the planner, MFU and
  the pre-flight checks read;
* ``build()``: the model, called under ``torch.device("meta")``; its forward takes token ids
  ``(batch, seq)`` and returns logits ``(batch, seq, vocab)``;
* ``blocks``: the dotted path of the ``ModuleDict``/``ModuleList`` of repeated blocks (FSDP
  units, activation checkpointing, pipeline stages, devices of the model-parallel spread);
* ``init_parameter(name, value, generator)``: fill the whole parameter ``name`` in place with
  its initial value (see :mod:`trainers.core.materialize`); ``shared_parameters``: parameters
  that are another one under a second name (a tied head), mapped to that one's name;
  ``init_buffers(model)`` (optional): fill the buffers of the allocated model (rotary tables);
* ``tp_plan(sequence_parallel)`` (optional): one block's tensor-parallel plan, submodule path
  -> ``ParallelStyle``, as ``parallelize_module`` takes it; without one ``--tp`` > 1 is refused;
* ``first``/``last``: the modules outside the blocks that only the first (input side) and the
  last (output side) pipeline stage hold. With ``shape.pipeline`` the model's forward skips
  the ones set to None and then takes or returns hidden states (a stage of the model).

Built-in families: :func:`trainers.core.model.gpt_spec` and :func:`trainers.core.llama.llama_spec`;
``hf:DIR``: :func:`trainers.core.hf_model.hf_spec`; a user's spec: ``MODULE:ATTR``
(``examples/custom_model`` is a worked example).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from trainers.torchfree.config import TrainConfig
from trainers.torchfree.errors import ConfigError
from trainers.torchfree.model_names import hf_shape, import_spec, model_kind
from trainers.torchfree.shapes import FAMILIES, MODEL_SIZES, ModelConfig

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


def normal_init(std: float) -> ParameterInit:
    """N(0, std) for matrices and embeddings, 1 for norm weights and 0 for biases: a
    reasonable ``init_parameter`` for a model of linear layers, embeddings and norms."""
    def init(name: str, value: torch.Tensor, generator: torch.Generator) -> None:
        if value.dim() >= 2:
            value.normal_(mean=0.0, std=std, generator=generator)
        else:
            value.fill_(0.0 if name.endswith("bias") else 1.0)
    return init


def builtin_spec(shape: ModelConfig) -> ModelSpec:
    """The spec of a built-in family's model of ``shape``."""
    if shape.family == "llama":
        from trainers.core.llama import llama_spec
        return llama_spec(shape)
    from trainers.core.model import gpt_spec
    return gpt_spec(shape)


def resolve_spec(name: str, dropout: float = 0.0, attention: str = "sdpa",
                 attention_window: int = 256) -> ModelSpec:
    """The spec ``--model name`` names; the built-in families take the dropout and attention
    options. ConfigError (one line) when it cannot be resolved."""
    kind = model_kind(name)
    if kind == "builtin":
        return builtin_spec(dataclasses.replace(
            MODEL_SIZES[name], dropout=dropout, attention=attention,
            attention_window=attention_window))
    if kind == "hf":
        from trainers.core.hf_model import hf_spec
        return hf_spec(name, hf_shape(name))
    spec = import_spec(name)
    if not isinstance(spec, ModelSpec):
        raise ConfigError(f"--model {name}: {type(spec).__name__} is not a ModelSpec; build it "
                          "with trainers.core.model_spec.ModelSpec(...)")
    return spec


def spec_of(cfg: TrainConfig) -> ModelSpec:
    """The spec of the model ``cfg`` trains."""
    return resolve_spec(cfg.model, cfg.dropout, cfg.attention, cfg.attention_window)


def build_model(name: str, dropout: float = 0.0, attention: str = "sdpa",
                attention_window: int = 256, seed: int | None = None,
                device: torch.device | str = "cpu") -> nn.Module:
    """The model ``--model name`` names, built on the meta device and materialized on
    ``device`` with the weights every trainer gives it for ``seed`` (default: the seed torch
    was last seeded with); see :mod:`trainers.core.materialize`. Raises ValueError for an
    unknown attention, a window < 1, or dropout > 0 with an attention other than ``sdpa``."""
    from trainers.core.materialize import materialize
    spec = resolve_spec(name, dropout, attention, attention_window)
    model = spec.meta_model()
    materialize(model, torch.device(device), torch.initial_seed() if seed is None else seed,
                spec)
    return model

"""LoRA: low-rank adapters on a model's linear layers, applied to its spec (docs/finetuning.md).

:func:`with_lora` turns any :class:`~trainers.models.protocol.ModelSpec` (a built-in family,
``hf:DIR``, ``MODULE:ATTR``) into the spec of the same model with adapters: every ``nn.Linear``
whose last name part is a target becomes a :class:`LoRALinear`, which keeps the base layer's
``weight`` and ``bias`` under their names (frozen: ``requires_grad=False``) and adds
``lora_A`` (rank x in, PEFT's kaiming-uniform initialization) and ``lora_B`` (out x rank,
zeros): ``y = x W^T + b + B(A(dropout(x))) * alpha / rank``. The base's parameters are filled
by the base spec's ``init_parameter`` (``hf:DIR``'s safetensors, a family's seeded init) and the
adapters from the same ``(seed, name)`` generators :func:`trainers.models.weights.materialize`
gives every parameter, so every trainer at every world size starts from the same adapters.

A training run with ``--dtype bf16`` holds the frozen base's linear layers (their weights and
biases: every ``nn.Linear`` but the adapters, targeted or not, the head included unless it is
tied to the embedding) in bf16 (:func:`~trainers.models.run_spec.spec_of`, ``frozen_dtype``):
they never step, so they need no fp32 master, and autocast and FSDP's bf16 policy compute with
their bf16 cast anyway.
:func:`trainers.models.weights.materialize` fills them with the bf16 rounding of their fp32
initial value, so such a run computes exactly what it did with an fp32 base. Embeddings and
norms stay fp32 (autocast reads them in fp32), and so do the adapters. A run's model rebuilt
for sampling and export (:func:`~trainers.models.run_spec.run_spec`) keeps an fp32 base.

Every trainer builds from the spec :mod:`trainers.models.run_spec` resolves (for a run's
recorded options too: sampling, export), which applies this when ``--lora-rank`` > 0, so adapters
exist before any parallelism is applied (FSDP2 then wraps frozen and trainable parameters in
one unit) and before any weight is allocated. This module lives with the models, not in
:mod:`trainers.parallel`: it is a change of the model, and :mod:`trainers.tools.run_model`
(which rebuilds a run's model for sampling and export) needs it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainers.errors import ConfigError
from trainers.models.protocol import ModelSpec
from trainers.sizing.memory_formulas import LORA_DEFAULT_TARGETS, parse_targets

ADAPTER_SUFFIXES = (".lora_A.weight", ".lora_B.weight")


class LoRALinear(nn.Linear):
    """A linear layer with a low-rank adapter; ``weight``/``bias`` are the base layer's own
    parameters (same names, so the base's weights, checkpoints and exports are unchanged)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: it would make a weight of its own
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        device = base.weight.device
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, device=device)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, device=device)
        self.lora_dropout = nn.Dropout(dropout)
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (F.linear(x, self.weight, self.bias)
                + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling)

    @torch.no_grad()
    def delta(self) -> torch.Tensor:
        """The adapter's change of ``weight``: ``B A * alpha / rank``."""
        return self.lora_B.weight @ self.lora_A.weight * self.scaling


def target_modules(model: nn.Module, spec: ModelSpec, family: str,
                   targets: tuple[str, ...]) -> list[str]:
    """The paths of ``model``'s linear layers that ``targets`` (last name parts; empty: the
    default of ``family``) name. ConfigError naming the candidates when a target matches
    none."""
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    # Family key (trainers.models.registry.family_key) -> the default targets; other families
    # (MODULE:ATTR): every linear layer inside the blocks.
    wanted = targets or LORA_DEFAULT_TARGETS.get(family, ())
    if not wanted:
        return [n for n in linears if n.startswith(spec.blocks + ".")]
    found = [n for n in linears if n.rpartition(".")[2] in wanted]
    missing = [t for t in wanted if not any(n.rpartition(".")[2] == t for n in found)]
    if missing:
        names = sorted({n.rpartition(".")[2] for n in linears})
        raise ConfigError(f"--lora-targets {','.join(missing)} matches no linear layer of the "
                          f"model; pass some of {','.join(names)}")
    return found


def add_adapters(model: nn.Module, paths: list[str], rank: int, alpha: float,
                 dropout: float) -> nn.Module:
    """Freeze every parameter of ``model`` and replace each linear layer at ``paths`` with a
    :class:`LoRALinear` of it (in place; ``model`` is returned)."""
    model.requires_grad_(False)
    for path in paths:
        owner, _, attribute = path.rpartition(".")
        parent = model.get_submodule(owner)
        setattr(parent, attribute, LoRALinear(getattr(parent, attribute), rank, alpha, dropout))
    return model


def hold_frozen_linears(model: nn.Module, dtype: torch.dtype, shared: Mapping[str, str]) -> None:
    """Hold the weight and bias of every frozen linear layer of ``model`` (adapters excepted)
    in ``dtype``, in place; a parameter that aliases another (a tied head, named in
    ``shared``) is left as it is."""
    for path, module in model.named_modules():
        if not isinstance(module, nn.Linear) or path.rpartition(".")[2] in ("lora_A", "lora_B"):
            continue
        for attribute in ("weight", "bias"):
            param = module._parameters.get(attribute)
            if (param is not None and not param.requires_grad
                    and f"{path}.{attribute}" not in shared):
                module._parameters[attribute] = nn.Parameter(param.to(dtype), requires_grad=False)


def with_lora(spec: ModelSpec, family: str, rank: int, alpha: float, dropout: float,
              targets: str, frozen_dtype: torch.dtype = torch.float32) -> ModelSpec:
    """The spec of ``spec``'s model (of family key ``family``) with rank-``rank`` adapters on
    the layers ``targets`` names, the frozen linear layers held in ``frozen_dtype`` (see the
    module doc); ConfigError when a target matches no linear layer."""
    paths = target_modules(spec.meta_model(), spec, family, parse_targets(targets))
    base_init = spec.init_parameter

    def build() -> nn.Module:
        model = add_adapters(spec.build(), paths, rank, alpha, dropout)
        if frozen_dtype != torch.float32:
            hold_frozen_linears(model, frozen_dtype, spec.shared_parameters)
        return model

    def init_parameter(name: str, value: torch.Tensor, generator: torch.Generator) -> None:
        if name.endswith(ADAPTER_SUFFIXES[0]):
            nn.init.kaiming_uniform_(value, a=math.sqrt(5), generator=generator)
        elif name.endswith(ADAPTER_SUFFIXES[1]):
            value.zero_()
        else:
            base_init(name, value, generator)

    return dataclasses.replace(spec, build=build, init_parameter=init_parameter, tp_plan=None)


def lora_from_options(spec: ModelSpec, family: str, options: Mapping[str, Any],
                      frozen_dtype: torch.dtype = torch.float32) -> ModelSpec:
    """``spec`` (of family key ``family``) with the adapters a run's options ask for (a
    ``TrainConfig`` as a dict, or the config in a checkpoint's manifest), its frozen linear
    layers in ``frozen_dtype``; ``spec`` itself when ``lora_rank`` is 0 or absent."""
    rank = options.get("lora_rank", 0)
    if not rank:
        return spec
    return with_lora(spec, family, rank, options["lora_alpha"], options["lora_dropout"],
                     options["lora_targets"], frozen_dtype)


def _adapters_asked(options: Mapping[str, Any]) -> str:
    """The adapters a run's options ask for, in words."""
    if not options.get("lora_rank", 0):
        return "no adapters (every parameter trained)"
    return (f"adapters of --lora-rank {options['lora_rank']} on --lora-targets "
            f"'{options['lora_targets']}'")


def check_resumable(saved: Mapping[str, Any], options: Mapping[str, Any],
                    checkpoint: str) -> None:
    """ConfigError unless a run of ``options`` can resume ``checkpoint``, saved by a run of
    ``saved``: the same adapters (rank and targets; alpha and dropout may change) or none."""
    if _adapters_asked(saved) != _adapters_asked(options):
        raise ConfigError(f"--resume {checkpoint}: it holds {_adapters_asked(saved)} but this "
                          f"run asks for {_adapters_asked(options)}; pass the checkpoint's LoRA "
                          "options, or --resume none (or another --output-dir) to start anew")


def adapters(model: nn.Module) -> dict[str, LoRALinear]:
    """The adapted layers of ``model`` by path."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


@torch.no_grad()
def merge_adapters(model: nn.Module) -> None:
    """Fold every adapter into its base weight (``W + B A * alpha / rank``) and zero ``B``:
    the model computes what it did, its base weights alone now holding the adapters."""
    for layer in adapters(model).values():
        layer.weight.add_(layer.delta())
        layer.lora_B.weight.zero_()

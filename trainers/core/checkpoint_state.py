"""What a checkpoint holds: the run's state as ``Stateful`` objects, registered once with
:class:`trainers.core.checkpoint.Checkpointer`.

The model and optimizer (:class:`ModelAndOptimizer`) and the step (:class:`Progress`) go
through DCP, sharded or not, so a checkpoint resumes at another world size; each rank's RNG
(:class:`RankRNG`) is private to its rank and restored at the same world size only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    _get_fqns,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful


class ModelAndOptimizer(Stateful):
    """Model and optimizer through DCP's state-dict API (sharded, keyed by parameter name).

    Only trained parameters are saved: a model with frozen ones (LoRA's base) is rebuilt from
    where it came from (its seed, ``hf:DIR``) and its checkpoint holds the adapters only.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        # The state-dict names of frozen parameters, under every name (a tied head's too):
        # DCP's own ignore_frozen_params leaves a tied alias in. _get_fqns is DCP's mapping of
        # a parameter's path to its state-dict names (wrapper prefixes removed).
        self.frozen = {fqn for name, p in model.named_parameters(remove_duplicate=False)
                       if not p.requires_grad for fqn in _get_fqns(model, name)}
        # Optimizer state and hyper-parameters keyed by parameter name: ranks holding different
        # parameters (pipeline stages) then never write the same key with different contents.
        # Loading is strict unless frozen parameters are left out of the checkpoint.
        self.options = StateDictOptions(flatten_optimizer_state_dict=True,
                                        strict=not self.frozen)

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self.options)
        return {"model": {k: v for k, v in model_sd.items() if k not in self.frozen},
                "optim": optim_sd}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=self.options)


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

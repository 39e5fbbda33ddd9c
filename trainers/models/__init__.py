"""Models: the model-spec protocol, the families ``--model`` names, and their weights.

Write your own model as a :class:`ModelSpec` and name it ``--model MODULE:ATTR``::

    from trainers.models import ModelSpec, normal_init

(``examples/custom_model`` is a worked example; docs/models.md describes the protocol). The
built-in GPT (:mod:`trainers.models.gpt`) and Llama (:mod:`trainers.models.llama`) families,
``hf:DIR`` (:mod:`trainers.models.huggingface`) and ``MODULE:ATTR``
(:mod:`trainers.models.user`) register in :mod:`trainers.models.registry`, which
:func:`resolve_spec` looks them up in; :func:`spec_of` is the spec a run trains, adapted for
LoRA. This layer imports torch and the torch-free layers, never :mod:`trainers.core` or
:mod:`trainers.parallel`, which build on it.
"""

from trainers.models.common import normal_init
from trainers.models.protocol import ModelSpec, ParameterInit, TensorParallelPlan, counted_params
from trainers.models.registry import resolve_spec
from trainers.models.run_spec import spec_of
from trainers.models.weights import allocate, build_model, materialize

__all__ = ["ModelSpec", "ParameterInit", "TensorParallelPlan", "allocate", "build_model",
           "counted_params", "materialize", "normal_init", "resolve_spec", "spec_of"]

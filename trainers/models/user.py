"""``--model MODULE:ATTR``: a user's :class:`trainers.models.ModelSpec`, registered as the
``module`` family (``examples/custom_model`` is a worked example)."""

from __future__ import annotations

from trainers.errors import ConfigError
from trainers.models.protocol import ModelSpec
from trainers.models.registry import register_family
from trainers.options.model_names import import_spec
from trainers.sizing.shapes import ModelConfig


def user_spec(name: str, shape: ModelConfig) -> ModelSpec:
    """The ModelSpec ``MODULE:ATTR`` names (``shape`` is its own); ConfigError (one line) when
    it is something else."""
    spec = import_spec(name)
    if not isinstance(spec, ModelSpec):
        raise ConfigError(f"--model {name}: {type(spec).__name__} is not a ModelSpec; build it "
                          "with trainers.models.ModelSpec(...)")
    return spec


register_family("module", user_spec)

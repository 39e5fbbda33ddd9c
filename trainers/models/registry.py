"""The families ``--model`` names resolve through, and the functions that resolve them.

A family is a function ``(name, shape) -> ModelSpec``: the ``--model`` name and its shape facts
(:func:`trainers.options.model_names.model_shape`, a built-in size's with the run's dropout
and attention) to the spec the trainers build from. Families register themselves under a key
with :func:`register_family` when their module is imported; the key of a ``--model`` name is
its built-in size's family (``gpt``, ``llama``), ``hf`` (``hf:DIR``) or ``module``
(``MODULE:ATTR``). The built-in families' modules are imported by name on the first lookup of
their key (:data:`BUILTIN_FAMILIES`), so this module imports none of them and they import it.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

from trainers.errors import ConfigError
from trainers.models.protocol import ModelSpec
from trainers.options.model_names import model_kind, model_shape
from trainers.sizing.shapes import MODEL_SIZES, ModelConfig

Family = Callable[[str, ModelConfig], ModelSpec]

# Key -> the module that registers the family of that key when imported.
BUILTIN_FAMILIES = {"gpt": "trainers.models.gpt", "llama": "trainers.models.llama",
                    "hf": "trainers.models.huggingface", "module": "trainers.models.user"}

_families: dict[str, Family] = {}


def register_family(key: str, family: Family) -> None:
    """Make ``family`` the one that builds the specs of key ``key``; ValueError if one has."""
    if key in _families:
        raise ValueError(f"model family {key!r} is already registered")
    _families[key] = family


def get_family(key: str) -> Family:
    """The family registered under ``key``, importing its built-in module on first lookup."""
    if key not in _families and key in BUILTIN_FAMILIES:
        importlib.import_module(BUILTIN_FAMILIES[key])
    if key not in _families:
        raise ConfigError(f"no model family {key!r} is registered; pass a model of the families "
                          f"{', '.join(sorted(set(_families) | set(BUILTIN_FAMILIES)))}")
    return _families[key]


def family_key(name: str) -> str:
    """The key of the family ``--model name`` resolves through."""
    kind = model_kind(name)
    return MODEL_SIZES[name].family if kind == "builtin" else kind


def resolve_spec(name: str, dropout: float = 0.0, attention: str = "sdpa",
                 attention_window: int = 256) -> ModelSpec:
    """The spec ``--model name`` names; the built-in families take the dropout and attention
    options. ConfigError (one line) when it cannot be resolved."""
    if model_kind(name) == "builtin":
        shape = dataclasses.replace(MODEL_SIZES[name], dropout=dropout, attention=attention,
                                    attention_window=attention_window)
        return get_family(family_key(name))(name, shape)
    return get_family(family_key(name))(name, model_shape(name))

"""What ``--model`` names, resolved to shape facts without torch.

``--model`` takes a built-in size (:data:`trainers.sizing.shapes.MODEL_SIZES`), ``hf:DIR`` (a
Hugging Face causal LM whose ``config.json`` is in ``DIR``, a local directory or a bucket URL
such as ``s3://bucket/models/llama``) or ``MODULE:ATTR`` (a :class:`trainers.models.ModelSpec`
named ``ATTR`` in module ``MODULE``, importable from the working directory or an installed
package). The facts of a built-in or ``hf:`` model are read without torch; of a bucket's
``hf:`` model only config.json and each safetensors file's header are read (ranged requests),
never its tensors. A ``MODULE:ATTR`` spec is user code and is imported to read its facts.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from trainers.errors import ConfigError, MissingPathError
from trainers.runs.storage import RunPath, is_remote, is_url, location, store_reason
from trainers.sizing.shapes import MODEL_SIZES, ModelConfig

HF_PREFIX = "hf:"
MODEL_HELP = ("a built-in size (" + ", ".join(MODEL_SIZES) + "), hf:DIR (a Hugging Face causal "
              "LM's directory, local or a bucket URL) or MODULE:ATTR (a ModelSpec)")
# Hugging Face model types built like the llama family (RMSNorm, rotary, SwiGLU, GQA).
HF_LLAMA_TYPES = ("llama", "mistral", "qwen2")
# How the class names in a config.json's architectures of a causal LM end.
CAUSAL_LM_CLASSES = ("ForCausalLM", "LMHeadModel")
# The model types whose bare config.json (no architectures) the trainers build as a causal LM.
BARE_CAUSAL_TYPES = (*HF_LLAMA_TYPES, "gpt2")


def model_kind(name: str) -> str:
    """``builtin``, ``hf`` or ``module``; ConfigError for a name that is none of them."""
    if name in MODEL_SIZES:
        return "builtin"
    if name.startswith(HF_PREFIX):
        return "hf"
    module, _, attr = name.partition(":")
    if module and attr and all(p.isidentifier() for p in module.split(".")) and attr.isidentifier():
        return "module"
    raise ConfigError(f"--model {name}: not a built-in size, hf:DIR or MODULE:ATTR; pass one of "
                      f"{', '.join(MODEL_SIZES)}, hf:path/to/model or my_module:MY_SPEC")


def in_store(name: str) -> bool:
    """Whether ``--model name`` is an ``hf:`` directory on an object store (read only where
    stores are reached: never for a dry run)."""
    return model_kind(name) == "hf" and is_url(name[len(HF_PREFIX):])


def hf_directory(name: str) -> RunPath:
    """The directory of ``hf:DIR`` (a ``Path``, or a ``UPath`` for a bucket URL); ConfigError
    unless it holds ``config.json`` (for a URL: also unless its store can be read,
    :func:`trainers.runs.storage.store_reason`)."""
    given = name[len(HF_PREFIX):]
    folder = location(given, "--model") if is_url(given) else Path(given).expanduser()
    reason = store_reason(folder, write=False) if is_remote(folder) else None
    if reason is not None:
        raise ConfigError(f"--model {name}: {reason}")
    if not (folder / "config.json").is_file():
        where = "a bucket prefix" if is_remote(folder) else "a local directory"
        raise MissingPathError(f"--model {name}: {folder / 'config.json'} does not exist; pass "
                               f"hf: and {where} holding a Hugging Face config.json")
    return folder


def hf_shape(name: str) -> ModelConfig:
    """Shape facts from ``hf:DIR``'s config.json: exact for llama-type models, else estimated
    from the transformer's widths (12 L d^2 plus embeddings). ConfigError (one line) for a
    config.json that is not a causal LM's or a safetensors file there that is not whole. A
    bucket's directory is read once per process (a start asks several times)."""
    return _stored_shape(name) if in_store(name) else _read_hf_shape(name)


@functools.cache
def _stored_shape(name: str) -> ModelConfig:
    return _read_hf_shape(name)


def _read_hf_shape(name: str) -> ModelConfig:
    folder = hf_directory(name)
    path = folder / "config.json"
    try:
        config: dict[str, Any] = json.loads(path.read_text())
        check_causal_lm(config)
        d, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        heads, vocab = int(config["num_attention_heads"]), int(config["vocab_size"])
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"--model {name}: {path} is not a causal LM config ({err}); pass the "
                          "directory of a causal LM saved by transformers' save_pretrained (its "
                          "architectures end in ForCausalLM)") from None
    for weights in sorted(folder.glob("*.safetensors")):
        try:
            check_safetensors(weights)
        except ValueError as err:
            raise ConfigError(f"--model {name}: {weights} is not a readable safetensors file "
                              f"({err}); copy or save it again with save_pretrained, or pass a "
                              "directory without it to start from the initialization") from None
    context = int(config.get("max_position_embeddings", 2048))
    tied = bool(config.get("tie_word_embeddings", False))
    common = {"vocab_size": vocab, "n_layers": layers, "n_heads": heads, "d_model": d,
              "max_seq_len": context, "tensor_parallel": False, "pipeline": False}
    if config.get("model_type") in HF_LLAMA_TYPES:
        rope = config.get("rope_parameters") or {}
        return ModelConfig(**common, family="llama",
                           n_kv_heads=int(config.get("num_key_value_heads") or heads),
                           ffn_dim=int(config["intermediate_size"]), tied_head=tied,
                           rope_theta=float(rope.get("rope_theta", config.get("rope_theta",
                                                                               10000.0))),
                           norm_eps=float(config.get("rms_norm_eps", 1e-6)))
    estimate = 12 * layers * d * d + (1 if tied else 2) * vocab * d
    return ModelConfig(**common, family=str(config.get("model_type", "hf")), params=estimate)


def check_causal_lm(config: dict[str, Any]) -> None:
    """ValueError unless the Hugging Face ``config`` is a causal LM's that the trainers build:
    its ``architectures`` name one (``...ForCausalLM``, ``...LMHeadModel``), or, without
    ``architectures`` (a bare config), its ``model_type`` is one whose causal LM is known to
    build (:data:`BARE_CAUSAL_TYPES`); it is not an encoder-decoder, and its embeddings are not
    an encoder's (``type_vocab_size``: BERT's family, whose ``...LMHeadModel`` holds position
    and token-type buffers the trainers do not shard)."""
    architectures = config.get("architectures") or []
    model_type = config.get("model_type", "model")
    if not isinstance(architectures, list) or not all(isinstance(a, str)
                                                       for a in architectures):
        raise ValueError(f"architectures {architectures!r} is not a list of class names")
    if architectures and not any(a.endswith(CAUSAL_LM_CLASSES) for a in architectures):
        raise ValueError(f"it describes a {', '.join(architectures)}")
    if not architectures and model_type not in BARE_CAUSAL_TYPES:
        raise ValueError(f"it names no architectures; its model_type is {model_type}")
    if config.get("is_encoder_decoder"):
        raise ValueError(f"it describes an encoder-decoder {model_type}")
    if "type_vocab_size" in config:
        found = ", ".join(architectures) or f"model_type {model_type}"
        raise ValueError(f"it describes a {found} with an encoder's token-type embeddings")


def read_range(path: RunPath, start: int, end: int) -> bytes:
    """Bytes ``start`` to ``end`` (exclusive) of file ``path``: on an object store one ranged
    request for exactly them."""
    if is_remote(path):
        return path.fs.cat_file(path.path, start=start, end=end)
    with path.open("rb") as file:
        file.seek(start)
        return file.read(end - start)


def safetensors_header(path: RunPath) -> tuple[dict[str, Any], int]:
    """(the header, the offset where the tensors' bytes begin) of safetensors file ``path``,
    read from its first bytes only. ValueError unless the file is whole: an 8-byte
    little-endian header length, that many bytes of JSON naming each tensor's
    ``data_offsets``, then exactly the bytes those offsets span."""
    size = path.stat().st_size
    length = int.from_bytes(read_range(path, 0, min(8, size)) if size else b"", "little")
    if size < 8 or 8 + length > size:
        raise ValueError(f"its header length {length:,} runs past the file's {size:,} bytes")
    try:
        header = json.loads(read_range(path, 8, 8 + length))
        ends = [int(entry["data_offsets"][1]) for key, entry in header.items()
                if key != "__metadata__"]
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as err:
        raise ValueError(f"its header is not safetensors JSON: {err}") from None
    data = size - 8 - length
    if max(ends, default=0) != data:
        raise ValueError(f"its header spans {max(ends, default=0):,} bytes of tensors, the file "
                         f"holds {data:,}")
    return header, 8 + length


def check_safetensors(path: RunPath) -> None:
    """ValueError unless ``path`` is a whole safetensors file (:func:`safetensors_header`)."""
    safetensors_header(path)


def import_spec(name: str) -> Any:
    """The object ``MODULE:ATTR`` names, imported with the working directory on the path;
    ConfigError when it does not import or has no shape facts."""
    module_name, _, attr = name.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - any failure of user code is reported in one line
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"--model {name}: module {module_name} does not import ({reason}); "
                          "pass a module importable from the working directory or an installed "
                          "package") from None
    spec = getattr(module, attr, None)
    if not isinstance(getattr(spec, "shape", None), ModelConfig) or not callable(
            getattr(spec, "build", None)):
        raise ConfigError(f"--model {name}: {module_name}.{attr} is not a model spec; define "
                          f"{attr} = trainers.models.ModelSpec(...) in {module_name}")
    return spec


def model_shape(name: str, load: bool = True, reach_stores: bool = True) -> ModelConfig | None:
    """The shape facts of ``--model name``. With ``load`` False (a job for a cluster, whose
    files this machine may not have) a ``MODULE:ATTR`` or ``hf:DIR`` model gives None instead
    of being read; so does an ``hf:`` bucket URL with ``reach_stores`` False (a dry run), whose
    scheme alone is checked. Raises ConfigError (one line) for a name that cannot be
    resolved."""
    kind = model_kind(name)
    if kind == "builtin":
        return MODEL_SIZES[name]
    if in_store(name):
        location(name[len(HF_PREFIX):], "--model")
        if not reach_stores:
            return None
    if not load:
        return None
    return hf_shape(name) if kind == "hf" else import_spec(name).shape

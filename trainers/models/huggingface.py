"""``--model hf:DIR``: a Hugging Face causal LM from a directory, as a model spec.

``DIR`` is a local directory or a bucket URL (``hf:s3://bucket/models/llama``, through fsspec).
The model is built from ``DIR/config.json`` with ``transformers`` (an extra: ``pip install
-e .[hf]``) on the meta device, like every model here, so FSDP shards it before any memory is
allocated. Its weights come from ``DIR``'s safetensors files when it has any (each rank reads
only the tensors it materializes, whole, and keeps its shard), otherwise from Hugging Face's
initialization (N(0, ``initializer_range``), norm weights 1, biases 0). Nothing is downloaded
from a hub, and nothing from a bucket is written to disk: a local file is memory-mapped, a
bucket's file is read a tensor at a time with one ranged request each (its header once), so no
byte is fetched twice and no local copy of a multi-GB file is needed.
ddp and fsdp (with activation checkpointing) train it; it has no tensor-parallel plan and no
pipeline split, so those trainers refuse it before it starts. The module registers it as the
``hf`` family; what the torch-free checks refuse (a config.json that is not a causal LM's, an
unreadable safetensors file) never reaches it (:mod:`trainers.options.model_names`).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainers.errors import ConfigError
from trainers.models.common import normal_init
from trainers.models.protocol import ModelSpec, ParameterInit
from trainers.models.registry import register_family
from trainers.options.model_names import hf_directory, read_range, safetensors_header
from trainers.runs.storage import RunPath, is_remote
from trainers.sizing.shapes import ModelConfig


class CausalLM(nn.Module):
    """A Hugging Face causal LM as the trainers call models: ids ``(batch, seq)`` -> logits;
    packed samples' ``positions`` go in as ``position_ids``, from which transformers masks
    attention to each sample (its packed-sequence detection: a position that does not follow
    the one before starts a sample)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None
                ) -> torch.Tensor:
        return self.model(input_ids=tokens, position_ids=positions, use_cache=False).logits


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ConfigError("--model hf:...: transformers is not installed; pip install -e '.[hf]'"
                          ) from None
    return transformers


@contextlib.contextmanager
def _local_config(folder: RunPath) -> Iterator[Path]:
    """A local directory holding ``folder``'s config.json: ``folder`` itself, or for a bucket a
    scratch directory with a copy of that one file."""
    if not is_remote(folder):
        yield folder
        return
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "config.json").write_bytes((folder / "config.json").read_bytes())
        yield Path(scratch)


def _load_config(folder: RunPath):
    transformers = _transformers()
    try:
        with _local_config(folder) as local:
            config = transformers.AutoConfig.from_pretrained(local, local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(f"--model hf:{folder}: config.json does not load ({err}); pass a "
                          "directory saved by transformers' save_pretrained") from None
    config._attn_implementation = "sdpa"
    return config


class StoredSafetensors:
    """A safetensors file on an object store, opened as ``safe_open`` opens a local one:
    ``keys()`` from its header (read once), ``get_tensor(key)`` with one ranged request for
    exactly that tensor's bytes, decoded by the safetensors library."""

    def __init__(self, path: RunPath) -> None:
        self.path = path
        self.header, self.start = safetensors_header(path)
        self.header.pop("__metadata__", None)

    def keys(self) -> list[str]:
        return list(self.header)

    def get_tensor(self, key: str) -> torch.Tensor:
        from safetensors.torch import load

        entry = self.header[key]
        begin, end = entry["data_offsets"]
        alone = json.dumps({key: {**entry, "data_offsets": [0, end - begin]}}).encode()
        # The tensor's bytes are held at most twice at once: the one-tensor file, its decoding.
        one = len(alone).to_bytes(8, "little") + alone + read_range(
            self.path, self.start + begin, self.start + end)
        return load(one)[key]


def _weight_files(folder: RunPath) -> dict[str, Any]:
    """Tensor name -> the open safetensors file holding it (memory-mapped locally, a
    :class:`StoredSafetensors` on an object store), over every file in ``folder``; each file is
    opened once."""
    from safetensors import safe_open
    found: dict[str, Any] = {}
    for path in sorted(folder.glob("*.safetensors")):
        handle = StoredSafetensors(path) if is_remote(path) else safe_open(path, framework="pt")
        found.update({key: handle for key in handle.keys()})  # noqa: SIM118 - not a dict
    return found


def _initializer(folder: RunPath, std: float, prefix: str) -> ParameterInit:
    """Each parameter from the safetensors tensor of its name (without ``prefix``), else
    Hugging Face's initialization."""
    files = _weight_files(folder)
    fallback = normal_init(std)

    def init(name: str, value: torch.Tensor, generator: torch.Generator) -> None:
        key = name.removeprefix(prefix)
        if key not in files:
            if files:
                raise ConfigError(f"--model hf:{folder}: the safetensors files there have no "
                                  f"tensor {key}; save the model with save_pretrained")
            fallback(name, value, generator)
            return
        tensor = files[key].get_tensor(key)
        if tensor.shape != value.shape:
            raise ConfigError(f"--model hf:{folder}: {key} is {tuple(tensor.shape)} in the "
                              f"safetensors file but {tuple(value.shape)} in config.json")
        value.copy_(tensor)
    return init


def _init_rotary(model: nn.Module) -> None:
    """Recompute the rotary inverse frequencies, the only buffers these models hold; any other
    buffer is refused (its values would be lost on the meta device)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    for module_name, module in model.named_modules():
        own = dict(module.named_buffers(recurse=False))
        if not own:
            continue
        if "inv_freq" not in own:
            raise ConfigError(f"--model hf:...: {module_name} holds buffers "
                              f"{', '.join(own)}; only models whose buffers are rotary tables "
                              "are supported")
        rope_type = getattr(module, "rope_type", "default")
        compute = (module.compute_default_rope_parameters if rope_type == "default"
                   else ROPE_INIT_FUNCTIONS[rope_type])
        inv_freq, module.attention_scaling = compute(module.config)
        for buffer in own.values():
            buffer.copy_(inv_freq)


def _blocks_path(model: nn.Module) -> str:
    """The dotted path of the longest ModuleList: the decoder layers."""
    lists = [(len(m), name) for name, m in model.named_modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        raise ConfigError("--model hf:...: the model has no list of layers to shard")
    return max(lists)[1]


def _shared(model: nn.Module) -> dict[str, str]:
    """Parameters reachable under a second name (a tied head), mapped to the first name."""
    first: dict[int, str] = {}
    shared: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            shared[name] = first[id(param)]
        else:
            first[id(param)] = name
    return shared


def hf_spec(name: str, shape: ModelConfig) -> ModelSpec:
    """The spec of ``hf:DIR`` whose shape facts are ``shape``."""
    folder = hf_directory(name)
    config = _load_config(folder)
    transformers = _transformers()

    def build() -> nn.Module:
        return CausalLM(transformers.AutoModelForCausalLM.from_config(
            config, dtype=torch.float32))

    try:
        with torch.device("meta"):
            probe = build()
    except ValueError as err:  # a config class AutoModelForCausalLM has no model for
        reason = str(err).splitlines()[0]
        raise ConfigError(f"--model {name}: transformers builds no causal LM from its "
                          f"config.json ({reason}); pass the directory of a causal LM") from None
    return ModelSpec(shape=shape, build=build, blocks=_blocks_path(probe),
                     init_parameter=_initializer(folder, config.initializer_range, "model."),
                     shared_parameters=_shared(probe), init_buffers=_init_rotary)


def tiny_llama_config(folder: Path, vocab_size: int = 256) -> Path:
    """Write a tiny Llama ``config.json`` into ``folder`` (tests and examples): 4 layers, 64
    wide, 4 query and 2 key/value heads, 64 positions."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab_size, "hidden_size": 64, "intermediate_size": 176,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "initializer_range": 0.02,
        "tie_word_embeddings": False, "rope_theta": 10000.0}, indent=1))
    return folder


register_family("hf", hf_spec)

"""A run's model and tokenizer as a Hugging Face directory (``from_pretrained`` reads it).

:data:`CONVERTERS` maps a model family to the function that writes that family's
``config.json`` and ``model.safetensors``; :func:`write_tokenizer` writes the run's tokenizer
(``tokenizer.json`` and ``tokenizer_config.json``) whatever the family. A LoRA run's adapters
go beside the base in PEFT's format (:func:`write_adapter`: ``adapter_config.json`` and
``adapter_model.safetensors``, which ``peft.PeftModel.from_pretrained`` loads onto the base),
written without peft. Needs the ``hf`` extra (transformers, safetensors, tokenizers).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from trainers.errors import ConfigError
from trainers.formats.tokenizer import BYTES, load_tokenizer
from trainers.models.lora import LoRALinear, adapters
from trainers.options.model_names import hf_directory, model_kind, model_shape
from trainers.runs.storage import location

# (model, the run's config as a dict, output directory) -> writes config.json and weights.
Converter = Callable[[nn.Module, dict[str, Any], Path], None]

WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"


def export_gpt(model: nn.Module, config: dict[str, Any], out: Path) -> None:
    """The built-in GPT family as ``GPT2LMHeadModel``: the same function (exact GELU, LayerNorm
    eps 1e-5, learned positions, tied head) with Conv1D weights (``(in, out)``, the transpose of
    a Linear's), q, k and v concatenated into ``c_attn``, and zero biases where ours have none.

    Raises ConfigError for an attention GPT-2 does not compute (linear attention, or a sliding
    window shorter than the context).
    """
    from transformers import GPT2Config

    shape = model_shape(config["model"])
    _check_attention(config, shape.max_seq_len, "GPT-2")
    GPT2Config(vocab_size=shape.vocab_size, n_positions=shape.max_seq_len, n_embd=shape.d_model,
               n_layer=shape.n_layers, n_head=shape.n_heads, n_inner=shape.d_ff,
               activation_function="gelu", layer_norm_epsilon=1e-5,
               resid_pdrop=shape.dropout, embd_pdrop=shape.dropout, attn_pdrop=shape.dropout,
               bos_token_id=None, eos_token_id=None, tie_word_embeddings=True,
               architectures=["GPT2LMHeadModel"]).save_pretrained(out)
    ours = model.state_dict()
    tensors = {"transformer.wte.weight": ours["tok_emb.weight"],
               "transformer.wpe.weight": ours["pos_emb.weight"],
               "transformer.ln_f.weight": ours["norm.weight"],
               "transformer.ln_f.bias": ours["norm.bias"]}
    for i in range(shape.n_layers):
        block, layer = f"blocks.{i}.", f"transformer.h.{i}."
        conv1d = {"attn.c_attn": torch.cat([ours[f"{block}attn.{w}.weight"]
                                            for w in ("wq", "wk", "wv")]),
                  "attn.c_proj": ours[f"{block}attn.wo.weight"],
                  "mlp.c_fc": ours[f"{block}mlp.up.weight"],
                  "mlp.c_proj": ours[f"{block}mlp.down.weight"]}
        for name, linear in conv1d.items():
            tensors[f"{layer}{name}.weight"] = linear.t()
            tensors[f"{layer}{name}.bias"] = linear.new_zeros(linear.shape[0])
        for norm, ln in (("attn_norm", "ln_1"), ("mlp_norm", "ln_2")):
            tensors[f"{layer}{ln}.weight"] = ours[f"{block}{norm}.weight"]
            tensors[f"{layer}{ln}.bias"] = ours[f"{block}{norm}.bias"]
    save_file({name: t.contiguous() for name, t in tensors.items()}, out / WEIGHTS,
              metadata={"format": "pt"})


def _check_attention(config: dict[str, Any], context: int, target: str) -> None:
    """ConfigError for a run whose attention ``target`` does not compute (linear attention,
    or a sliding window shorter than the context)."""
    attention, window = config["attention"], config["attention_window"]
    if attention == "linear" or (attention == "sliding_window" and window < context):
        raise ConfigError(f"the run's attention {attention!r} (window {window}) is not "
                          f"{target}'s full causal softmax attention; only runs with sdpa, naive, "
                          f"tiled or a sliding window of at least {context} export to {target}")


# Our llama block's parameter -> LlamaForCausalLM's, under blocks.<i> and model.layers.<i>.
LLAMA_BLOCK = {"attn_norm": "input_layernorm", "attn.wq": "self_attn.q_proj",
               "attn.wk": "self_attn.k_proj", "attn.wv": "self_attn.v_proj",
               "attn.wo": "self_attn.o_proj", "mlp_norm": "post_attention_layernorm",
               "mlp.gate": "mlp.gate_proj", "mlp.up": "mlp.up_proj", "mlp.down": "mlp.down_proj"}


def export_llama(model: nn.Module, config: dict[str, Any], out: Path) -> None:
    """The built-in llama family as ``LlamaForCausalLM``: the same layout (rotary on the two
    halves of each head, SwiGLU, RMSNorm), so its weights are renamed, not transformed."""
    from transformers import LlamaConfig

    shape = model_shape(config["model"])
    _check_attention(config, shape.max_seq_len, "Llama")
    LlamaConfig(vocab_size=shape.vocab_size, hidden_size=shape.d_model,
                intermediate_size=shape.d_ff, num_hidden_layers=shape.n_layers,
                num_attention_heads=shape.n_heads, num_key_value_heads=shape.kv_heads,
                max_position_embeddings=shape.max_seq_len, rms_norm_eps=shape.norm_eps,
                rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
                tie_word_embeddings=shape.tied, attention_bias=False, mlp_bias=False,
                bos_token_id=None, eos_token_id=None, pad_token_id=None,
                architectures=["LlamaForCausalLM"]).save_pretrained(out)
    ours = model.state_dict()
    tensors = {"model.embed_tokens.weight": ours["tok_emb.weight"],
               "model.norm.weight": ours["norm.weight"]}
    if not shape.tied:
        tensors["lm_head.weight"] = ours["head.weight"]
    for i in range(shape.n_layers):
        for name, theirs in LLAMA_BLOCK.items():
            tensors[f"model.layers.{i}.{theirs}.weight"] = ours[f"blocks.{i}.{name}.weight"]
    save_file({name: t.contiguous() for name, t in tensors.items()}, out / WEIGHTS,
              metadata={"format": "pt"})


def export_hf(model: nn.Module, config: dict[str, Any], out: Path) -> None:
    """An ``hf:DIR`` model as it was read: DIR's config.json and the model's own weights under
    their own names (a tied head once), without adapters."""
    (out / "config.json").write_bytes((hf_directory(config["model"]) / "config.json")
                                      .read_bytes())
    skip = {f"{path}.{part}.weight" for path in adapters(model) for part in ("lora_A", "lora_B")}
    tensors = {name.removeprefix("model."): p.detach() for name, p in model.named_parameters()
               if name not in skip}
    save_file({name: t.contiguous() for name, t in tensors.items()}, out / WEIGHTS,
              metadata={"format": "pt"})


# Model family -> its converter.
CONVERTERS: dict[str, Converter] = {"gpt": export_gpt, "llama": export_llama, "hf": export_hf}


def model_family(config: dict[str, Any]) -> str:
    """The family of the run's model; ConfigError for a model no converter writes (the
    built-in families and ``hf:DIR`` export; a ``MODULE:ATTR`` model has no Hugging Face
    counterpart)."""
    kind = model_kind(config["model"])
    if kind == "builtin":
        return model_shape(config["model"]).family
    if kind == "hf":
        return "hf"
    raise ConfigError(f"no exporter for model {config['model']!r}; the built-in families "
                      f"and hf:DIR ({', '.join(sorted(CONVERTERS))}) export")


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

# Where one adapted layer of ours lands in the exported model: (its module path there, its
# slot in that module's output, how many slots the output has). GPT-2's c_attn holds q, k, v
# in slots 0, 1, 2; every other layer is one slot of its own.
AdapterPlace = tuple[str, int, int]
_GPT_PLACES = {"attn.wq": ("attn.c_attn", 0, 3), "attn.wk": ("attn.c_attn", 1, 3),
               "attn.wv": ("attn.c_attn", 2, 3), "attn.wo": ("attn.c_proj", 0, 1),
               "mlp.up": ("mlp.c_fc", 0, 1), "mlp.down": ("mlp.c_proj", 0, 1)}


def _block_place(path: str, table: dict[str, tuple[str, int, int]],
                 prefix: str) -> AdapterPlace | None:
    """The place of our block layer ``path`` (``blocks.<i>.<name>``) by ``table``."""
    head, _, name = path.partition(".")[2].partition(".")
    if path.startswith("blocks.") and name in table:
        theirs, slot, slots = table[name]
        return f"{prefix}{head}.{theirs}", slot, slots
    return None


# Model family -> (our adapted layer's path -> its place, None: no counterpart; whether the
# exported layers are Conv1D, whose weights are (in, out): PEFT's fan_in_fan_out).
ADAPTER_PLACES: dict[str, tuple[Callable[[str], AdapterPlace | None], bool]] = {
    "gpt": (lambda path: _block_place(path, _GPT_PLACES, "transformer.h."), True),
    "llama": (lambda path: _block_place(path, {k: (v, 0, 1) for k, v in LLAMA_BLOCK.items()},
                                        "model.layers."), False),
    "hf": (lambda path: (path.removeprefix("model."), 0, 1), False),
}


# An adapter in PEFT's format: the tensors of adapter_model.safetensors, adapter_config.json.
Adapter = tuple[dict[str, torch.Tensor], dict[str, Any]]


def peft_adapter(model: nn.Module, config: dict[str, Any], base: str) -> Adapter:
    """The run's adapters in PEFT's format: keys ``base_model.model.<module>.lora_A.weight``/
    ``lora_B.weight`` and the config (``base``: the base model's name or path). Adapters that
    share one exported module (GPT's q, k, v in ``c_attn``) become one adapter of their summed
    rank, A stacked and B block-diagonal, whose scale stays alpha / rank through PEFT's
    ``rank_pattern`` and ``alpha_pattern``: the same function exactly. ConfigError for an
    adapted layer that has no counterpart in the exported model."""
    family = model_family(config)
    place_of, conv1d = ADAPTER_PLACES[family]
    rank, alpha = config["lora_rank"], config["lora_alpha"]
    groups: dict[str, list[tuple[int, int, LoRALinear]]] = {}
    for path, layer in adapters(model).items():
        place = place_of(path)
        if place is None:
            raise ConfigError(f"the adapter on {path} has no counterpart in the exported "
                              f"{family} model; train with --lora-targets of the blocks' layers")
        theirs, slot, slots = place
        groups.setdefault(theirs, []).append((slot, slots, layer))
    tensors: dict[str, torch.Tensor] = {}
    rank_pattern: dict[str, int] = {}
    alpha_pattern: dict[str, float] = {}
    for theirs, members in groups.items():
        members.sort(key=lambda member: member[0])
        key = f"base_model.model.{theirs}"
        tensors[f"{key}.lora_A.weight"] = torch.cat([m.lora_A.weight for _, _, m in members])
        width = members[0][2].out_features
        b = members[0][2].lora_B.weight.new_zeros(width * members[0][1], rank * len(members))
        for column, (slot, _, layer) in enumerate(members):
            b[slot * width:(slot + 1) * width, column * rank:(column + 1) * rank] = \
                layer.lora_B.weight
        tensors[f"{key}.lora_B.weight"] = b
        if len(members) > 1:
            rank_pattern[theirs] = rank * len(members)
            alpha_pattern[theirs] = alpha * len(members)
    settings = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
                "r": rank, "lora_alpha": alpha, "lora_dropout": config["lora_dropout"],
                "target_modules": sorted(groups), "fan_in_fan_out": conv1d, "bias": "none",
                "rank_pattern": rank_pattern, "alpha_pattern": alpha_pattern,
                "use_rslora": False, "use_dora": False, "init_lora_weights": True,
                "inference_mode": True, "modules_to_save": None}
    return {name: t.detach().contiguous() for name, t in tensors.items()}, settings


def write_adapter(adapter: Adapter, out: Path) -> None:
    """``adapter`` (:func:`peft_adapter`) as ``adapter_model.safetensors`` and
    ``adapter_config.json`` in ``out``."""
    tensors, settings = adapter
    save_file(tensors, out / ADAPTER_WEIGHTS, metadata={"format": "pt"})
    (out / ADAPTER_CONFIG).write_text(json.dumps(settings, indent=1) + "\n")


def byte_tokenizer() -> Any:
    """A ``tokenizers.Tokenizer`` whose ids are UTF-8 byte values: a byte-level BPE without
    merges over GPT-2's byte-to-character table, no regex split, no prefix space."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def write_tokenizer(config: dict[str, Any], out: Path, context: int) -> None:
    """The run's tokenizer in ``out``: its tokenizer.json copied (from a path or a bucket URL),
    or for a byte-level run one whose ids are the bytes; and a tokenizer_config.json for
    ``AutoTokenizer``."""
    tokenizer = load_tokenizer(config.get("tokenizer", BYTES))
    if tokenizer.hf is None:
        byte_tokenizer().save(str(out / TOKENIZER))
    else:
        (out / TOKENIZER).write_bytes(location(tokenizer.name).read_bytes())
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": context,
                "clean_up_tokenization_spaces": False}
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=1) + "\n")

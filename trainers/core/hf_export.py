"""A run's model and tokenizer as a Hugging Face directory (``from_pretrained`` reads it).

:data:`CONVERTERS` maps a model family to the function that writes that family's
``config.json`` and ``model.safetensors``; :func:`write_tokenizer` writes the run's tokenizer
(``tokenizer.json`` and ``tokenizer_config.json``) whatever the family. Needs the ``hf`` extra
(transformers, safetensors, tokenizers).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from trainers.torchfree.errors import ConfigError
from trainers.torchfree.model_names import model_kind, model_shape
from trainers.torchfree.storage import location
from trainers.torchfree.tokenizer import BYTES, load_tokenizer

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


# Model family -> its converter.
CONVERTERS: dict[str, Converter] = {"gpt": export_gpt, "llama": export_llama}


def model_family(config: dict[str, Any]) -> str:
    """The family of the run's model; ConfigError for a model no converter writes (only the
    built-in families export: an hf: model is a Hugging Face model already)."""
    if model_kind(config["model"]) == "builtin":
        return model_shape(config["model"]).family
    raise ConfigError(f"no exporter for model {config['model']!r}; the built-in families "
                      f"({', '.join(sorted(CONVERTERS))}) export")


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

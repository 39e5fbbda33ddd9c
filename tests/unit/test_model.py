"""The built-in families: shapes, causality, heads, parameter count and FLOPs from the config."""

from __future__ import annotations

import math

import pytest
import torch

from trainers.models import build_model, resolve_spec
from trainers.sizing.shapes import MODEL_SIZES


def test_logits_shape_and_dtype():
    model = build_model("tiny")
    tokens = torch.randint(0, 256, (3, 17))
    logits = model(tokens)
    assert logits.shape == (3, 17, 256) and logits.dtype == torch.float32


def test_attention_is_causal():
    torch.manual_seed(0)
    model = build_model("tiny").eval()
    tokens = torch.randint(0, 256, (1, 32))
    changed = tokens.clone()
    changed[0, 20:] = (changed[0, 20:] + 1) % 256
    before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :20], after[:, :20])
    assert not torch.allclose(before[:, 20:], after[:, 20:])


def test_head_is_tied_to_the_embedding():
    model = build_model("tiny")
    assert model.head.weight is model.tok_emb.weight


@pytest.mark.parametrize("name", sorted(MODEL_SIZES))
def test_parameter_count_matches_the_config(name):
    model = resolve_spec(name).meta_model()
    assert sum(p.numel() for p in model.parameters()) == MODEL_SIZES[name].num_params()


def test_named_sizes():
    params = {name: cfg.num_params() for name, cfg in MODEL_SIZES.items()}
    assert params["tiny"] < 1_000_000
    assert 10_000_000 < params["small"] < 11_500_000
    small = MODEL_SIZES["small"]
    assert (small.n_layers, small.n_heads, small.d_model, small.max_seq_len) == (6, 6, 384, 256)
    assert 120e6 < params["125m"] < 130e6
    assert 1.0e9 < params["1b"] < 1.2e9
    assert 6.5e9 < params["7b"] < 7.0e9


def test_flops_per_token_follow_6n_plus_attention():
    cfg = MODEL_SIZES["small"]
    n = cfg.num_params() - cfg.max_seq_len * cfg.d_model
    assert cfg.flops_per_token(256) == 6 * n + 12 * 6 * 384 * 256


def test_initial_loss_is_near_uniform():
    torch.manual_seed(0)
    model = build_model("tiny")
    tokens, targets = torch.randint(0, 256, (2, 4, 64))
    loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
    assert abs(loss.item() - math.log(256)) < 0.1


def test_weights_come_from_the_seed_and_the_name_alone():
    """Built on the meta device and materialized, a part of the model (a pipeline stage, with
    activation checkpointing) gets exactly the whole model's weights of the same names."""
    from trainers.models import materialize
    from trainers.parallel.checkpointing import apply_activation_checkpointing
    from trainers.parallel.pipeline import split_stage

    whole = dict(build_model("tiny", seed=7).named_parameters())
    assert not torch.equal(whole["tok_emb.weight"],
                           build_model("tiny", seed=8).tok_emb.weight)
    for stage in range(2):
        spec = resolve_spec("tiny")
        part = split_stage(spec.meta_model(), spec, stage, 2)
        apply_activation_checkpointing(part, spec)
        materialize(part, torch.device("cpu"), 7, spec)
        names = part.state_dict().keys()  # wrapper prefixes removed, tied head included
        assert ("tok_emb.weight" in names) == (stage == 0) and ("head.weight" in names) == stage
        for name, value in part.state_dict().items():
            source = "tok_emb.weight" if name == "head.weight" else name
            assert torch.equal(value, whole[source]), name
    block = whole["blocks.0.attn.wo.weight"]
    assert abs(block.std().item() - 0.02 / math.sqrt(2 * 4)) < 0.002  # scaled residual init

"""The attention implementations: agreement with the reference formulas (forward and backward),
memory that stays below the score matrix, the model training with each, and config checks."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.distributed._tools.mem_tracker import MemTracker

from trainers.config.parsing import build_parser, parse_config
from trainers.errors import ConfigError
from trainers.models import build_model
from trainers.models.attention import (
    ATTENTIONS,
    attention_fn,
    linear,
    naive,
    sdpa,
    sliding_window,
    tiled,
)
from trainers.models.gpt import Attention
from trainers.options.train_config import TrainConfig
from trainers.sizing.shapes import MODEL_SIZES

TOL = {"atol": 1e-5, "rtol": 0.0}


def qkv(shape: tuple[int, ...], seed: int = 0) -> tuple[torch.Tensor, ...]:
    """q, k, v (requiring grad) and an upstream gradient, standard normal, fp32."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(shape, generator=gen) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), grad


def forward_backward(fn: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out, (q, k, v), grad))


def assert_all_close(actual: tuple[torch.Tensor, ...], expected: tuple[torch.Tensor, ...]
                     ) -> None:
    for name, a, e in zip(("out", "dq", "dk", "dv"), actual, expected, strict=True):
        torch.testing.assert_close(a, e, **TOL, msg=lambda m, name=name: f"{name}: {m}")


def banded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """naive with query i seeing keys i - window < j <= i: the full matrix, masked."""
    i = torch.arange(q.shape[-2])
    hidden = (i[None, :] > i[:, None]) | (i[None, :] <= i[:, None] - window)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(hidden, -math.inf)
    return torch.softmax(scores, dim=-1) @ v


def quadratic_linear(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal linear attention as the masked, row-normalised (phi(q) phi(k)^T) v."""
    weights = ((F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-2, -1)).tril()
    return weights @ v / weights.sum(dim=-1, keepdim=True)


# (batch, heads, seq, head_dim), block: seq divisible by the block and not, block > seq,
# a single token, the default block.
SHAPES = [((2, 3, 77, 16), 16), ((1, 2, 128, 8), 32), ((2, 2, 5, 4), 2), ((1, 2, 40, 8), 64),
          ((1, 1, 1, 8), 4), ((1, 4, 300, 32), None)]


@pytest.mark.parametrize("shape, block", SHAPES)
def test_tiled_matches_naive_forward_and_backward(shape, block):
    inputs = qkv(shape)
    fn = tiled if block is None else lambda q, k, v: tiled(q, k, v, block=block)
    assert_all_close(forward_backward(fn, *inputs), forward_backward(naive, *inputs))


@pytest.mark.parametrize("shape", [(2, 3, 77, 16), (1, 4, 300, 32)])
def test_sdpa_matches_naive_forward_and_backward(shape):
    inputs = qkv(shape)
    assert_all_close(forward_backward(sdpa, *inputs), forward_backward(naive, *inputs))


@pytest.mark.parametrize("window, block", [(77, 16), (1000, 10), (200, None)])
def test_sliding_window_at_least_seq_is_naive(window, block):
    inputs = qkv((2, 3, 77, 16))
    kwargs = {} if block is None else {"block": block}
    fn = lambda q, k, v: sliding_window(q, k, v, window, **kwargs)  # noqa: E731
    assert_all_close(forward_backward(fn, *inputs), forward_backward(naive, *inputs))


@pytest.mark.parametrize("window, block", [(1, 8), (5, 4), (5, 16), (16, 7), (33, None)])
def test_sliding_window_is_naive_with_a_banded_mask(window, block):
    inputs = qkv((2, 2, 70, 8), seed=1)
    kwargs = {} if block is None else {"block": block}
    fn = lambda q, k, v: sliding_window(q, k, v, window, **kwargs)  # noqa: E731
    reference = lambda q, k, v: banded(q, k, v, window)  # noqa: E731
    assert_all_close(forward_backward(fn, *inputs), forward_backward(reference, *inputs))


@pytest.mark.parametrize("shape, chunk", [((2, 3, 77, 16), 16), ((1, 2, 64, 8), 64),
                                          ((1, 2, 100, 8), None), ((2, 1, 9, 4), 1)])
def test_linear_matches_its_quadratic_form(shape, chunk):
    inputs = qkv(shape, seed=2)
    fn = linear if chunk is None else lambda q, k, v: linear(q, k, v, chunk=chunk)
    assert_all_close(forward_backward(fn, *inputs), forward_backward(quadratic_linear, *inputs))


@pytest.mark.parametrize("name", ["tiled", "sliding_window", "linear"])
def test_blockwise_attention_never_holds_the_score_matrix(name):
    """Peak bytes of forward + backward beyond the inputs: a fraction of one (seq, seq) matrix
    per head for the blockwise ones, more than one for naive (the measurement's sanity)."""
    shape = (1, 1, 2048, 16)
    score_bytes = shape[0] * shape[1] * shape[2] ** 2 * 4

    def peak(fn: Callable[..., torch.Tensor]) -> int:
        q, k, v, grad = qkv(shape)
        tracker = MemTracker()
        tracker.track_external(q, k, v, grad)
        with tracker:
            start = tracker.get_tracker_snapshot()[q.device]["Total"]
            fn(q, k, v).backward(grad)
        return tracker.get_tracker_snapshot("peak")[q.device]["Total"] - start

    assert peak(naive) > score_bytes
    assert peak(attention_fn(name, window=32)) < score_bytes / 4


def test_unknown_attention_and_bad_window_raise():
    with pytest.raises(ValueError, match="unknown attention 'flash'"):
        attention_fn("flash", window=8)
    with pytest.raises(ValueError, match="window must be positive"):
        attention_fn("sliding_window", window=0)


def test_sdpa_attention_is_the_plain_sdpa_call():
    """The default keeps the model bit-for-bit what it was: projections, then one SDPA call."""
    torch.manual_seed(0)
    attn = Attention(MODEL_SIZES["tiny"])
    x = torch.randn(2, 24, 64)
    q, k, v = (w(x).view(2, 24, 4, 16).transpose(1, 2) for w in (attn.wq, attn.wk, attn.wv))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.0)
    expected = attn.wo(out.transpose(1, 2).reshape(2, 24, 64))
    assert torch.equal(attn(x), expected)


@pytest.mark.parametrize("name", ATTENTIONS)
def test_attention_runs_on_a_tensor_parallel_shard(name):
    """Half the heads' columns of wq/wk/wv and rows of wo give half the output: the two halves
    sum to the whole module's output (what the all-reduce after wo computes)."""
    cfg = dataclasses.replace(MODEL_SIZES["tiny"], attention=name, attention_window=8)
    torch.manual_seed(0)
    full = Attention(cfg)
    x = torch.randn(2, 20, cfg.d_model)
    half = cfg.d_model // 2
    parts = []
    for cols in (slice(0, half), slice(half, None)):
        shard = Attention(cfg)
        for proj in ("wq", "wk", "wv"):
            setattr(shard, proj, torch.nn.Linear(cfg.d_model, half, bias=False))
            getattr(shard, proj).weight.data = getattr(full, proj).weight.data[cols]
        shard.wo = torch.nn.Linear(half, cfg.d_model, bias=False)
        shard.wo.weight.data = full.wo.weight.data[:, cols]
        parts.append(shard(x))
    torch.testing.assert_close(parts[0] + parts[1], full(x), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ATTENTIONS)
def test_model_trains_with_each_attention(name):
    torch.manual_seed(0)
    model = build_model("tiny", attention=name, attention_window=16)
    assert model.cfg.attention == name
    # Each token is the previous plus a per-sequence stride: learnable from the context.
    stride = torch.arange(1, 9)[:, None]
    tokens = (stride + torch.arange(65)[None, :] * stride) % 256
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.5, losses


def test_model_refuses_attention_dropout_it_cannot_apply():
    with pytest.raises(ValueError, match="attention dropout needs the sdpa attention"):
        build_model("tiny", dropout=0.1, attention="tiled")
    build_model("tiny", dropout=0.1)  # sdpa applies it


def parse(tmp_path, *args: str) -> TrainConfig:
    return parse_config(["--output-dir", str(tmp_path / "run"), *args], "ddp",
                        world_sizes=[1])


def test_config_offers_every_attention(tmp_path):
    choices = {a.dest: a.choices for a in build_parser("ddp")._actions}
    assert tuple(choices["attention"]) == ATTENTIONS
    cfg = parse(tmp_path, "--attention", "sliding_window", "--attention-window", "32")
    assert (cfg.attention, cfg.attention_window) == ("sliding_window", 32)
    assert (TrainConfig().attention, TrainConfig().attention_window) == ("sdpa", 256)


@pytest.mark.parametrize("args, message", [
    (["--attention", "sliding_window", "--attention-window", "0"],
     "--attention-window must be positive, got 0; pass"),
    (["--attention", "sliding_window", "--attention-window=-4"],
     "--attention-window must be positive, got -4"),
    (["--attention-window", "64"], "--attention-window is used only by --attention sliding_window"),
    (["--attention", "linear", "--dropout", "0.1"], "--dropout 0.1 needs --attention sdpa"),
    (["--attention", "flash"], "invalid choice: 'flash'"),
])
def test_config_rejects_bad_attention_options(tmp_path, args, message):
    with pytest.raises(ConfigError, match=message):
        parse(tmp_path, *args)

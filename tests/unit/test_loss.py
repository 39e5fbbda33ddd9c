"""The chunked cross-entropy equals ``F.cross_entropy`` on fp32 logits, in value and gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainers.core import loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_rows", [1, 7, 64, 10_000])  # one row, ragged, exact, one chunk
def test_chunked_loss_and_gradient_equal_the_plain_ones(monkeypatch, dtype, chunk_rows):
    vocab = 50
    monkeypatch.setattr(loss, "CHUNK_BYTES", 4 * vocab * chunk_rows)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 16, vocab, generator=gen).to(dtype)
    targets = torch.randint(0, vocab, (4, 16), generator=gen)
    plain_logits = logits.clone().requires_grad_()
    plain = F.cross_entropy(plain_logits.flatten(0, 1).float(), targets.flatten())
    (3 * plain).backward()
    chunked_logits = logits.clone().requires_grad_()
    chunked = loss.cross_entropy(chunked_logits, targets)
    (3 * chunked).backward()
    assert chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=1e-6)
    assert chunked_logits.grad.dtype == dtype
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2  # the gradient is stored in bf16
    torch.testing.assert_close(chunked_logits.grad.float(), plain_logits.grad.float(),
                               rtol=tolerance, atol=tolerance * 1e-2)


def test_chunk_size_follows_the_vocabulary(monkeypatch):
    """64 MiB of fp32 logits per chunk: 128 rows of a 128k vocabulary."""
    seen = []
    forward = loss._ChunkedCrossEntropy.forward

    def spy(ctx, logits, targets, normalizer, chunk_rows):
        seen.append(chunk_rows)
        return forward(ctx, logits, targets, normalizer, chunk_rows)

    monkeypatch.setattr(loss._ChunkedCrossEntropy, "forward", staticmethod(spy))
    loss.cross_entropy(torch.zeros(1, 2, 131072), torch.zeros(1, 2, dtype=torch.long))
    assert seen == [128]


@pytest.mark.parametrize("chunk_rows", [1, 7, 10_000])
def test_ignored_targets_count_nowhere(monkeypatch, chunk_rows):
    """Targets of -100 (prompt tokens, padding) add nothing to the loss or its gradient: the
    loss is the hand-computed masked cross-entropy, and a shared normalizer divides the sum."""
    vocab = 30
    monkeypatch.setattr(loss, "CHUNK_BYTES", 4 * vocab * chunk_rows)
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 10, vocab, generator=gen)
    targets = torch.randint(0, vocab, (3, 10), generator=gen)
    targets[0, :6] = loss.IGNORE
    targets[2, 4:] = loss.IGNORE
    counted = targets != loss.IGNORE
    log_probs = logits.log_softmax(-1)
    by_hand = -log_probs.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1)[counted]
    plain_logits = logits.clone().requires_grad_()
    plain = F.cross_entropy(plain_logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    plain.backward()
    ours_logits = logits.clone().requires_grad_()
    ours = loss.cross_entropy(ours_logits, targets)
    ours.backward()
    torch.testing.assert_close(ours, by_hand.mean(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours_logits.grad, plain_logits.grad, rtol=1e-6, atol=1e-8)
    assert ours_logits.grad[0, :6].abs().sum() == 0
    shared = loss.cross_entropy(logits, targets, normalizer=torch.tensor(100.0))
    torch.testing.assert_close(shared, by_hand.sum() / 100, rtol=1e-6, atol=1e-6)
    assert loss.counted_tokens(targets) == counted.sum()

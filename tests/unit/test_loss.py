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

    def spy(ctx, logits, targets, chunk_rows):
        seen.append(chunk_rows)
        return forward(ctx, logits, targets, chunk_rows)

    monkeypatch.setattr(loss._ChunkedCrossEntropy, "forward", staticmethod(spy))
    loss.cross_entropy(torch.zeros(1, 2, 131072), torch.zeros(1, 2, dtype=torch.long))
    assert seen == [128]

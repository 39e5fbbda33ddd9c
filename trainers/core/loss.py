"""Next-token cross-entropy that never holds fp32 logits of the whole batch.

``F.cross_entropy(logits.float(), ...)`` makes an fp32 copy of every logit and keeps an fp32
log-softmax of the same size for backward: for a 128k vocabulary and 2,048 tokens that is
2 GiB beside the bf16 logits. :func:`cross_entropy` instead walks the tokens in chunks of at
most :data:`CHUNK_BYTES` of fp32 logits, computing each chunk's loss and its gradient in
forward, and keeps only the gradient, in the logits' own dtype, for backward. The result and
the gradient equal ``F.cross_entropy``'s (fp32 arithmetic per chunk).

Targets equal to :data:`IGNORE` (a prompt's tokens, padding) add nothing to the loss or the
gradient. The sum over the other targets is divided by ``normalizer``: by default their count
(the mean), or a count the caller shares across micro-batches and ranks, so that a step's loss
is the mean over every counted token of the global batch however they fall on micro-batches
(:meth:`trainers.core.strategy.Strategy.forward_backward`).
"""

from __future__ import annotations

import torch

# fp32 bytes of logits processed at once: 64 MiB is 128 tokens of a 128k vocabulary, or the
# whole batch of a byte-level model (one chunk: no loop overhead where chunking saves nothing).
CHUNK_BYTES = 64 * 2**20
IGNORE = -100  # a target that is not in the loss (PyTorch's and Hugging Face's ignore_index)


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor,  # type: ignore[override]
                normalizer: torch.Tensor, chunk_rows: int) -> torch.Tensor:
        rows = logits.shape[0]
        grad = torch.empty_like(logits) if logits.requires_grad else None
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for start in range(0, rows, chunk_rows):
            chunk = logits[start:start + chunk_rows].float()
            counted = targets[start:start + chunk_rows] != IGNORE
            target = targets[start:start + chunk_rows].clamp_min(0).unsqueeze(1)
            log_z = torch.logsumexp(chunk, dim=1, keepdim=True)
            total += ((log_z - chunk.gather(1, target)).squeeze(1) * counted).sum()
            if grad is not None:
                # d(loss)/d(logits) = (softmax - one_hot(target)) / normalizer, 0 if ignored
                probs = chunk.sub_(log_z).exp_()
                probs.scatter_add_(1, target, torch.full_like(target, -1, dtype=probs.dtype))
                probs.mul_(counted.unsqueeze(1))
                grad[start:start + chunk_rows] = probs.div_(normalizer)
        ctx.save_for_backward(grad)
        return total / normalizer

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # type: ignore[override]
        (grad,) = ctx.saved_tensors
        # In place: a second copy of the logits' size is what this function avoids. A graph
        # through this loss is therefore backpropagated once (no retain_graph reuse).
        return grad.mul_(grad_output.to(grad.dtype)), None, None, None


def counted_tokens(targets: torch.Tensor) -> torch.Tensor:
    """How many of ``targets`` are in the loss (not :data:`IGNORE`), as an fp32 scalar."""
    return (targets != IGNORE).sum().float()


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                  normalizer: torch.Tensor | None = None) -> torch.Tensor:
    """Summed cross-entropy (fp32 scalar) of ``logits`` ``(..., vocab)`` against ``targets``
    ``(...)`` over the targets that are not :data:`IGNORE`, divided by ``normalizer`` (default:
    their count, at least 1), in chunks of at most :data:`CHUNK_BYTES` fp32 logits (see the
    module docstring)."""
    flat = logits.flatten(0, -2)
    flat_targets = targets.to(logits.device).flatten()
    if normalizer is None:
        normalizer = counted_tokens(flat_targets).clamp_min(1)
    chunk_rows = max(1, CHUNK_BYTES // (4 * flat.shape[-1]))
    return _ChunkedCrossEntropy.apply(flat, flat_targets, normalizer.to(flat.device), chunk_rows)

"""Next-token cross-entropy that never holds fp32 logits of the whole batch.

``F.cross_entropy(logits.float(), ...)`` makes an fp32 copy of every logit and keeps an fp32
log-softmax of the same size for backward: for a 128k vocabulary and 2,048 tokens that is
2 GiB beside the bf16 logits. :func:`cross_entropy` instead walks the tokens in chunks of at
most :data:`CHUNK_BYTES` of fp32 logits, computing each chunk's loss and its gradient in
forward, and keeps only the gradient, in the logits' own dtype, for backward. The result and
the gradient equal ``F.cross_entropy``'s (fp32 arithmetic per chunk).
"""

from __future__ import annotations

import torch

# fp32 bytes of logits processed at once: 64 MiB is 128 tokens of a 128k vocabulary, or the
# whole batch of a byte-level model (one chunk: no loop overhead where chunking saves nothing).
CHUNK_BYTES = 64 * 2**20


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor,  # type: ignore[override]
                chunk_rows: int) -> torch.Tensor:
        rows = logits.shape[0]
        grad = torch.empty_like(logits) if logits.requires_grad else None
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for start in range(0, rows, chunk_rows):
            chunk = logits[start:start + chunk_rows].float()
            target = targets[start:start + chunk_rows].unsqueeze(1)
            log_z = torch.logsumexp(chunk, dim=1, keepdim=True)
            total += (log_z - chunk.gather(1, target)).sum()
            if grad is not None:
                # d(mean loss)/d(logits) = (softmax - one_hot(target)) / rows
                probs = chunk.sub_(log_z).exp_()
                probs.scatter_add_(1, target, torch.full_like(target, -1, dtype=probs.dtype))
                grad[start:start + chunk_rows] = probs.div_(rows)
        ctx.save_for_backward(grad)
        return total / rows

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # type: ignore[override]
        (grad,) = ctx.saved_tensors
        # In place: a second copy of the logits' size is what this function avoids. A graph
        # through this loss is therefore backpropagated once (no retain_graph reuse).
        return grad.mul_(grad_output.to(grad.dtype)), None, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (fp32 scalar) of ``logits`` ``(..., vocab)`` against ``targets``
    ``(...)``, in chunks of at most :data:`CHUNK_BYTES` fp32 logits (see the module docstring).
    """
    flat = logits.flatten(0, -2)
    flat_targets = targets.to(logits.device).flatten()
    chunk_rows = max(1, CHUNK_BYTES // (4 * flat.shape[-1]))
    return _ChunkedCrossEntropy.apply(flat, flat_targets, chunk_rows)

"""Autoregressive decoding with a model that maps ids ``(batch, seq)`` to logits."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def generate(model: nn.Module, prompt: list[int], tokens: int, context: int, vocab: int,
             temperature: float = 0.0, top_k: int = 0,
             generator: torch.Generator | None = None, stop: int | None = None) -> list[int]:
    """``tokens`` ids following ``prompt`` (not empty), one forward pass over the last
    ``context`` ids per token (no KV cache), drawn from the first ``vocab`` logits only;
    fewer when id ``stop`` (if given) is drawn, which ends them (and is not returned).

    ``temperature`` 0 takes the argmax (greedy, deterministic); above 0 samples from
    softmax(logits / temperature) restricted to the ``top_k`` most likely ids (0: all) with
    ``generator``. The caller checks ``tokens >= 0``, ``temperature >= 0`` and ``top_k >= 0``.
    """
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], device=device)
    for _ in range(tokens):
        logits = model(ids[:, -context:])[0, -1, :vocab].float()
        if temperature == 0:
            token = logits.argmax().view(1)
        else:
            logits = logits / temperature
            if 0 < top_k < vocab:
                logits[logits < torch.topk(logits, top_k).values[-1]] = float("-inf")
            token = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
        if stop is not None and int(token) == stop:
            break
        ids = torch.cat([ids, token.view(1, 1)], dim=1)
    return ids[0, len(prompt):].tolist()

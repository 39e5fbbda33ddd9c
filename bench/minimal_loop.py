"""The plain GPT training loop the trainer is measured against: ``python -m bench.minimal_loop``.

Forward, cross-entropy, backward, AdamW step, zero_grad, and nothing else: no DataLoader, no
gradient clipping, no LR schedule, no metrics, no process group. The model is
``build_model(name)`` from the same seed as the trainer's, the batches are the trainer's
synthetic Markov-chain sequences, sliced from one pre-built tensor, and AdamW has the trainer's
hyper-parameters and the same (default) implementation.

It writes ``{"stamps": [...], ...}`` to ``--out``: ``time.perf_counter()`` before the first step
and after every step, so consecutive differences are whole iterations.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trainers.core.data import MarkovChainDataset
from trainers.core.model import build_model
from trainers.spec.shapes import MODEL_SIZES


def run(model_name: str, batch_size: int, seq_len: int, steps: int, seed: int = 1234,
        samples: int = 512) -> dict[str, Any]:
    """Train ``steps`` steps; return the per-step time stamps and the first and last loss."""
    cfg = MODEL_SIZES[model_name]
    seq_len = seq_len or cfg.max_seq_len
    torch.manual_seed(seed)
    model = build_model(model_name)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95),
                                  weight_decay=0.1)
    tokens = MarkovChainDataset(cfg.vocab_size, seq_len, max(samples, batch_size), seed).tokens
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    batches = len(tokens) // batch_size
    losses: list[float] = []
    stamps = [time.perf_counter()]
    for step in range(steps):
        first = (step % batches) * batch_size
        x, y = inputs[first:first + batch_size], targets[first:first + batch_size]
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        stamps.append(time.perf_counter())
        if step in (0, steps - 1):
            losses.append(loss.item())
    return {"model": model_name, "batch_size": batch_size, "seq_len": seq_len, "steps": steps,
            "threads": torch.get_num_threads(), "stamps": stamps,
            "first_loss": losses[0], "final_loss": losses[-1]}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.minimal_loop",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", choices=sorted(MODEL_SIZES))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=0, help="0: the model's context length")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", required=True, help="JSON file for the time stamps")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = run(args.model, args.batch_size, args.seq_len, args.steps, args.seed)
    Path(args.out).write_text(json.dumps(result) + "\n")
    print(f"minimal loop: {args.steps} steps, loss {result['first_loss']:.4f} -> "
          f"{result['final_loss']:.4f}", flush=True)


if __name__ == "__main__":
    main()

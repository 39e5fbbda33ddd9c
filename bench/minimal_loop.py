"""The plain GPT training loop the trainer is measured against (docs/benchmarks.md).

Forward, cross-entropy, backward, AdamW step, zero_grad and nothing else, on the trainer's model,
seed, synthetic data and AdamW settings.
"""

import argparse
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from bench.harness import THREADS, write_rank
from trainers.core.data import MarkovChainDataset
from trainers.models import build_model
from trainers.sizing.shapes import MODEL_SIZES

SEED = 1234  # the trainer's default --seed


def run(model_name: str, batch_size: int, steps: int) -> dict[str, Any]:
    """Train ``steps`` steps; the first and last loss and ``stamps``: ``time.perf_counter()``
    before the first step and after every step, so differences are whole iterations."""
    cfg = MODEL_SIZES[model_name]
    torch.manual_seed(SEED)
    model = build_model(model_name)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    tokens = MarkovChainDataset(cfg.vocab_size, cfg.max_seq_len, max(512, batch_size), SEED).tokens
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
    return {"model": model_name, "batch_size": batch_size, "seq_len": cfg.max_seq_len,
            "steps": steps, "threads": torch.get_num_threads(), "stamps": stamps,
            "first_loss": losses[0], "final_loss": losses[-1]}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.minimal_loop",
                                     description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--model", default="small", choices=sorted(MODEL_SIZES))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--worker", metavar="PREFIX", required=True,
                        help="write the result to PREFIX.rank0.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(THREADS)
    result = run(args.model, args.batch_size, args.steps)
    write_rank(args.worker, result)
    print(f"minimal loop: {args.steps} steps, loss {result['first_loss']:.4f} -> "
          f"{result['final_loss']:.4f}", flush=True)


if __name__ == "__main__":
    main()

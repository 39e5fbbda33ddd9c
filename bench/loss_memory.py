"""The memory the next-token loss adds on top of the logits, chunked or plain (one process).

The logits (``tokens`` x ``vocab``, fp32 or bf16 as autocast's head returns them) exist before
the measurement starts; the figure is the growth of the process's peak resident set during the
loss's forward and backward: :func:`trainers.core.loss.cross_entropy` (``chunked``) against
``F.cross_entropy`` on the logits cast to fp32 (``plain``, what the trainers did before).
Run by ``bench.throughput`` in a fresh process per case; ``python -m bench.loss_memory --help``.
"""

import argparse
import resource
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from bench.harness import THREADS, write_rank
from trainers.core.loss import cross_entropy


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def measure(vocab: int, tokens: int, dtype: str, loss: str) -> dict[str, object]:
    """Peak growth in bytes over one loss forward and backward, and the logits' own size."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(tokens, vocab, generator=gen, requires_grad=True,
                         dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
    targets = torch.randint(0, vocab, (tokens,), generator=gen)
    before = peak_rss_bytes()
    value = (cross_entropy(logits, targets) if loss == "chunked"
             else F.cross_entropy(logits.float(), targets))
    value.backward()
    return {"vocab": vocab, "tokens": tokens, "dtype": dtype, "loss": loss,
            "logits_bytes": logits.numel() * logits.element_size(),
            "peak_delta_bytes": peak_rss_bytes() - before, "value": value.item()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.loss_memory",
                                     description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--loss", choices=["chunked", "plain"], default="chunked")
    parser.add_argument("--worker", metavar="PREFIX", help="write the result to "
                        "PREFIX.rank0.json instead of printing it")
    args = parser.parse_args(argv)
    torch.set_num_threads(THREADS)
    result = measure(args.vocab, args.tokens, args.dtype, args.loss)
    if args.worker:
        write_rank(args.worker, result)
    else:
        print(result)


if __name__ == "__main__":
    main()

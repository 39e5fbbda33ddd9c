"""Turn a text file into a token file for ``--data``: ``python -m trainers.prepare_data IN OUT``.

The tokenizer is byte-level: every UTF-8 byte is one token (vocabulary 256), so any text works
and nothing is downloaded. The output is read by :class:`trainers.core.data.TokenFileDataset`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from trainers.spec.token_file import write_token_file

BYTE_VOCAB = 256


def tokenize_file(source: Path, target: Path) -> int:
    """Write ``source``'s bytes as tokens to ``target``; return the token count."""
    tokens = np.fromfile(source, dtype=np.uint8)
    write_token_file(target, tokens, BYTE_VOCAB)
    return int(tokens.size)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="trainers.prepare_data",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="text file (any encoding; bytes are tokens)")
    parser.add_argument("target", type=Path, help="token file to write, e.g. data/corpus.bin")
    args = parser.parse_args(argv)
    if not args.source.is_file():
        parser.exit(2, f"trainers.prepare_data: error: {args.source}: no such file\n")
    if args.source.stat().st_size == 0:
        parser.exit(2, f"trainers.prepare_data: error: {args.source} is empty; pass a text file\n")
    count = tokenize_file(args.source, args.target)
    print(f"wrote {count:,} tokens (byte-level, vocab {BYTE_VOCAB}) to {args.target}",
          file=sys.stdout)


if __name__ == "__main__":
    main()

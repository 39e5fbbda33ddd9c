"""Train a byte-level BPE tokenizer on a corpus:
``python -m trainers.tools.train_tokenizer CORPUS... --vocab-size N --output tokenizer.json``.

CORPUS is a ``.txt``, ``.jsonl`` or ``.parquet`` file, a directory or a glob of them, on disk
or in a bucket (``s3://bkt/corpus/``), read by :mod:`trainers.formats.corpus` as training
reads text ``--data``; ``--output`` may be a URL too. The tokenizer (Hugging Face
``tokenizers``: GPT-2's byte-level pre-tokenizer and decoder, so any text round-trips) holds
``<|endoftext|>`` (id 0, the separator between documents), all 256 byte symbols (so any text
round-trips) and merges up to ``--vocab-size`` ids. Pass the file as ``--tokenizer`` to
training or ``trainers.tools.prepare_data``. A ``--vocab-size`` below 257 (the byte symbols and
``<|endoftext|>``: a smaller one would drop bytes when encoding) or above :data:`MAX_VOCAB`,
an ``--output`` that cannot be written and an empty corpus are refused in one line before
anything is written; the 256-id ``tiny`` and ``small`` models read text through
``--tokenizer bytes`` instead.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from trainers.config.parsing import OneLineParser, exit_on_config_error
from trainers.errors import ConfigError
from trainers.formats.corpus import check_corpus, check_not_empty, resolve_files, texts
from trainers.formats.data_source import DEFAULT_TEXT_FIELD
from trainers.formats.tokenizer import BYTE_LEVEL_VOCAB
from trainers.options.paths import check_output
from trainers.runs.storage import (
    RunPath,
    check_store,
    is_remote,
    location,
    write_bytes_atomic,
)

PROG = "trainers.tools.train_tokenizer"
END_OF_TEXT = "<|endoftext|>"
# The largest --vocab-size: tokenizers' BPE trainer allocates about 70 bytes per requested id
# up front (10**9 ids: 70 GB, then it aborts the process), and real vocabularies stay under
# 300,000; a token file would record up to 2**32 - 1.
MAX_VOCAB = 1 << 24


def train_tokenizer(files: Sequence[RunPath], text_field: str, vocab_size: int,
                    output: RunPath) -> int:
    """Train a byte-level BPE tokenizer of at most ``vocab_size`` ids (at least
    :data:`BYTE_LEVEL_VOCAB`) on ``files``, holding every byte symbol, and save it to ``output``;
    return its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.trainers import BpeTrainer

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT],
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                         show_progress=True)
    tokenizer.train_from_iterator(texts(files, text_field), trainer=trainer)
    trained = tokenizer.get_vocab_size(with_added_tokens=True)
    write_bytes_atomic(output, tokenizer.to_str(pretty=True).encode())
    return trained


def main(argv: Sequence[str] | None = None) -> None:
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0],
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("corpus", nargs="+",
                        help=".txt, .jsonl or .parquet file, directory or glob (quote it)")
    parser.add_argument("--vocab-size", type=int, required=True,
                        help=f"ids in the tokenizer (at least {BYTE_LEVEL_VOCAB}: the 256 bytes "
                        f"and {END_OF_TEXT}; at most the model's)")
    parser.add_argument("--output", required=True,
                        help="tokenizer.json to write (a path or an s3:// URL)")
    parser.add_argument("--text-field", default=DEFAULT_TEXT_FIELD,
                        help="the .jsonl field or .parquet column holding each document's text")
    with exit_on_config_error(PROG):
        args = parser.parse_args(argv)
        if args.vocab_size < BYTE_LEVEL_VOCAB:
            raise ConfigError(f"--vocab-size {args.vocab_size} cannot hold the 256 byte symbols "
                              f"and {END_OF_TEXT}; pass --vocab-size {BYTE_LEVEL_VOCAB} or more (a "
                              "256-id model such as tiny reads text with --tokenizer bytes)")
        if args.vocab_size > MAX_VOCAB:
            raise ConfigError(f"--vocab-size {args.vocab_size}: the trainer would allocate about "
                              f"70 bytes per id up front; pass --vocab-size {MAX_VOCAB} or less "
                              "(real vocabularies stay under 300,000)")
        files = resolve_files(args.corpus, flag="corpus")
        output = location(args.output, "--output")
        if is_remote(output):
            check_store(output.parent, "--output", write=True)
        else:
            check_output(output, "--output", inputs=files)
        check_corpus(files, args.text_field)
        check_not_empty(files, args.text_field, " ".join(args.corpus))
        vocab = train_tokenizer(files, args.text_field, args.vocab_size, output)
    print(f"wrote {output}: byte-level BPE, {vocab:,} ids, {END_OF_TEXT} = 0")


if __name__ == "__main__":
    main()

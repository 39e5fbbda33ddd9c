"""Tokenize text into a token file for ``--data``:
``python -m trainers.tools.prepare_data SOURCE... OUT.bin [--tokenizer bytes|tokenizer.json]``.

SOURCE is a ``.txt``, ``.jsonl`` or ``.parquet`` file, a directory or a glob of them (read by
:mod:`trainers.formats.corpus`, as training reads text ``--data``); SOURCE and OUT.bin may be
object-store URLs (``s3://bucket/corpus/``; the token file is uploaded whole when complete).
``--tokenizer bytes`` (the default) makes every UTF-8 byte one id (vocabulary 256); a
``tokenizer.json`` path or URL uses that Hugging Face tokenizer, with uint32 ids when its
vocabulary exceeds 65,536. Progress goes to stderr. The output is read by
:class:`trainers.core.data.TokenFileDataset`. A TARGET that cannot be written (a directory,
one of the sources, under a read-only directory, a bucket that cannot be written), a source
that names nothing (a missing object, a prefix or glob with no objects, a bucket that does not
exist) and an empty corpus are refused in one line before anything is written.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from trainers.config.parsing import OneLineParser, exit_on_config_error
from trainers.errors import ConfigError
from trainers.formats.corpus import (
    check_corpus,
    check_not_empty,
    progress_line,
    resolve_files,
    tokenize_corpus,
)
from trainers.formats.data_source import DEFAULT_TEXT_FIELD
from trainers.formats.token_file import dtype_for
from trainers.formats.tokenizer import BYTES, load_tokenizer
from trainers.options.paths import check_output
from trainers.runs.storage import check_store, is_remote, location

PROG = "trainers.tools.prepare_data"


def main(argv: Sequence[str] | None = None) -> None:
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0],
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("source", nargs="+",
                        help=".txt, .jsonl or .parquet file, directory or glob (quote it)")
    parser.add_argument("target", help="token file to write, e.g. data/corpus.bin or "
                        "s3://bucket/corpus.bin")
    parser.add_argument("--tokenizer", default=BYTES,
                        help="'bytes' or the path or URL of a Hugging Face tokenizer.json")
    parser.add_argument("--text-field", default=DEFAULT_TEXT_FIELD,
                        help="the .jsonl field or .parquet column holding each document's text")
    with exit_on_config_error(PROG):
        args = parser.parse_args(argv)
        files = resolve_files(args.source, flag="source")
        target = location(args.target, "target")
        if is_remote(target):
            if any(str(target) == str(p) for p in files):
                raise ConfigError(f"target {target} is also an input, which writing it would "
                                  "destroy; pass another path")
            check_store(target.parent, "target", write=True)
        else:
            check_output(target, "target", inputs=files)
        tokenizer = load_tokenizer(args.tokenizer)
        check_corpus(files, args.text_field)
        check_not_empty(files, args.text_field, " ".join(args.source))
        count = tokenize_corpus(files, args.text_field, tokenizer, target, progress_line())
    dtype = dtype_for(tokenizer.vocab_size).name
    print(f"wrote {count:,} tokens ({tokenizer.name}, vocab {tokenizer.vocab_size:,}, {dtype}) "
          f"to {target}")


if __name__ == "__main__":
    main()

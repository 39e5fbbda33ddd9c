"""What ``--data`` names, which data options apply to it, and where its token ids lie.

- ``synthetic``: built-in Markov-chain sequences;
- a token file (``.bin``, or any file with a token-file header): ids with their vocabulary;
- a raw ``.bin`` (nanoGPT: ids, no header), when ``--token-dtype`` and ``--vocab-size`` say
  how to read it;
- text: a plain-text (``.txt``, ``.md``, ``.py``), ``.jsonl`` or ``.parquet`` file, a directory
  or a glob of them, tokenized with ``--tokenizer`` once into a token file cached under
  ``<output-dir>/data/``, named by a hash of the files' paths, sizes and modification times
  (objects: URLs, sizes, ETags and modification times), the tokenizer and ``--text-field``;
  or, when its records are instruction or chat samples (``--data-format``), into a cache of
  samples (:mod:`trainers.formats.instruction_data`).

Each may be a local path or an object-store URL (``s3://...``, through
:func:`trainers.runs.storage.location`), and so may ``--output-dir`` that holds the cache.
A URL's kind is told by its suffix alone (``.bin``: a token file or raw array), so checking
the options reaches no server.

With a token file or a raw ``.bin``, ``--tokenizer`` names the tokenizer that made its ids
(``trainers.tools.sample`` and ``trainers.tools.export`` decode with it): its vocabulary must
be the token file's, or fit a raw ``.bin``'s ``--vocab-size``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from trainers.errors import ConfigError
from trainers.formats import instruction_data as samples
from trainers.formats.corpus import FIELD_SUFFIXES, check_corpus, file_stats, resolve_files
from trainers.formats.token_file import (
    TokenArray,
    check_raw_ids,
    check_token_array,
    has_header,
    raw_tokens,
    read_header,
)
from trainers.formats.tokenizer import BYTES, TextTokenizer, check_tokenizer_fits, load_tokenizer
from trainers.runs.storage import RunPath, is_remote, location

if TYPE_CHECKING:
    from trainers.options.train_config import TrainConfig

SYNTHETIC, TOKENS, RAW, TEXT = "synthetic", "token file", "raw .bin", "text"
DEFAULT_TEXT_FIELD = "text"
CACHE_VERSION = 1  # bump when the tokenization of the same files and tokenizer changes


def data_kind(cfg: TrainConfig) -> str:
    """Which of :data:`SYNTHETIC`, :data:`TOKENS`, :data:`RAW`, :data:`TEXT` ``--data`` is.
    A ``.bin`` is raw when ``--token-dtype`` or ``--vocab-size`` is given, else a token file."""
    if cfg.data == SYNTHETIC:
        return SYNTHETIC
    data = location(cfg.data, "--data")
    if data.suffix == ".bin" or (not is_remote(data) and has_header(data)):
        return RAW if cfg.token_dtype or cfg.vocab_size else TOKENS
    return TEXT


def check_data_options(cfg: TrainConfig) -> None:
    """Raise ConfigError if a data option is set where ``--data`` does not use it, or a raw
    ``.bin`` lacks one (no file is read beyond a token-file header)."""
    kind = data_kind(cfg)
    given_data = "synthetic data" if kind == SYNTHETIC else f"{kind} {cfg.data}"
    if cfg.vocab_size < 0:
        raise ConfigError(f"--vocab-size must be positive, got {cfg.vocab_size}")
    for flag, given in (("--token-dtype", cfg.token_dtype), ("--vocab-size", cfg.vocab_size)):
        if given and kind != RAW:
            raise ConfigError(f"{flag} applies only to a raw .bin --data (ids without a "
                              f"header), not {given_data}; drop {flag}")
    if kind == RAW and not (cfg.token_dtype and cfg.vocab_size):
        missing = ("--vocab-size N (ids below N)" if cfg.token_dtype
                   else "--token-dtype uint16|uint32")
        raise ConfigError(f"a raw .bin --data needs --token-dtype and --vocab-size; pass {missing}")
    if cfg.tokenizer != BYTES and kind == SYNTHETIC:
        raise ConfigError("--tokenizer applies to text data or the token file it made, not "
                          "synthetic data; drop --tokenizer")
    if cfg.text_field != DEFAULT_TEXT_FIELD and kind != TEXT:
        raise ConfigError(f"--text-field applies only to text --data (.jsonl or .parquet files), "
                          f"not {given_data}; drop --text-field")
    if cfg.batching != "auto" and kind != TEXT:
        raise ConfigError(f"--batching applies only to instruction and chat --data (.jsonl or "
                          f".parquet samples), not {given_data}; drop --batching")
    if cfg.long_samples != samples.SKIP and kind != TEXT:
        raise ConfigError(f"--long-samples applies only to instruction and chat --data (.jsonl "
                          f"or .parquet samples), not {given_data}; drop --long-samples")
    if cfg.data_format != "auto" and kind != TEXT:
        raise ConfigError(f"--data-format applies only to text --data (.txt, .jsonl or "
                          f".parquet files), not {given_data}; drop --data-format")


def text_source(cfg: TrainConfig) -> tuple[list[RunPath], TextTokenizer, RunPath]:
    """A text ``--data``'s files, its tokenizer, and the token file it is cached in."""
    files = resolve_files([cfg.data])
    if (cfg.text_field != DEFAULT_TEXT_FIELD
            and not any(p.suffix in FIELD_SUFFIXES for p in files)):
        raise ConfigError(f"--text-field applies only to .jsonl and .parquet files, and --data "
                          f"{cfg.data} holds none; drop --text-field")
    tokenizer = load_tokenizer(cfg.tokenizer)
    return files, tokenizer, cache_path(cfg.output_dir, files, tokenizer, cfg.text_field)


def instruction_source(cfg: TrainConfig) -> tuple[list[RunPath], TextTokenizer, str,
                                                  RunPath] | None:
    """A text ``--data`` of instruction or chat samples: its files, tokenizer, format and
    the samples' cache; None when it is read as plain text. ConfigError for an option its
    format does not read."""
    files, tokenizer, _ = text_source(cfg)
    fmt = samples.data_format(cfg, files)
    samples.check_format_options(cfg, fmt)
    samples.check_batching(cfg, fmt)
    samples.check_long_samples(cfg, fmt)
    if fmt == samples.TEXT:
        return None
    return files, tokenizer, fmt, samples.cache_path(cfg.output_dir, files, tokenizer, fmt, cfg)


def cache_path(output_dir: str, files: Sequence[RunPath], tokenizer: TextTokenizer,
               text_field: str) -> RunPath:
    """``<output_dir>/data/tokens-<key>.bin``: the key changes when a file is added, removed,
    resized or touched (an object: its URL and the hash of what the store reports of it, its
    size, ETag and modification time), or the tokenizer or text field changes."""
    stats = file_stats(files)
    key = json.dumps([CACHE_VERSION, stats, tokenizer.identity, text_field])
    name = f"tokens-{hashlib.sha256(key.encode()).hexdigest()[:16]}.bin"
    return location(output_dir, "--output-dir") / "data" / name


def token_array(cfg: TrainConfig) -> TokenArray:
    """The ids of a token file or raw ``.bin`` ``--data``."""
    data = location(cfg.data, "--data")
    if data_kind(cfg) == RAW:
        return raw_tokens(data, cfg.token_dtype, cfg.vocab_size)
    return read_header(data)


def check_data(cfg: TrainConfig, model_vocab: int) -> None:
    """Raise ConfigError unless ``--data`` (with its options) trains this model: files exist
    and read, ids fit the model's vocabulary, there are two sequences or more (instruction
    samples: left once those ``--seq-len`` cuts the whole completion of are skipped,
    :func:`~trainers.formats.instruction_data.kept_samples`). A text source not yet cached is
    checked without tokenizing it: its .jsonl lines and .parquet columns; instruction samples
    are tokenized."""
    kind = data_kind(cfg)
    if kind == SYNTHETIC:
        return
    if kind == RAW and cfg.vocab_size > model_vocab:
        raise ConfigError(f"--vocab-size {cfg.vocab_size} exceeds the model's vocabulary of "
                          f"{model_vocab}; pick a model with a larger vocabulary")
    if kind == TEXT and (instructions := instruction_source(cfg)) is not None:
        files, tokenizer, fmt, cache = instructions
        check_tokenizer_fits(tokenizer, model_vocab)
        tokenized = (samples.read_samples(cache) if cache.is_file()
                     else samples.tokenize_samples(files, fmt, cfg, tokenizer))
        samples.kept_samples(tokenized, cfg, str(cache))
        return
    if kind == TEXT:
        files, tokenizer, cache = text_source(cfg)
        check_tokenizer_fits(tokenizer, model_vocab)
        if not cache.is_file():
            check_corpus(files, cfg.text_field)
            return
        array = read_header(cache)
    else:
        array = token_array(cfg)
    if kind == RAW:
        check_raw_ids(array)
    if kind != TEXT and cfg.tokenizer != BYTES:
        _check_tokenizer_made(load_tokenizer(cfg.tokenizer), array, kind)
    check_token_array(array, cfg.seq_len, model_vocab)


def _check_tokenizer_made(tokenizer: TextTokenizer, array: TokenArray, kind: str) -> None:
    """ConfigError unless ``tokenizer`` could have made the ids of ``array``: the token file's
    vocabulary, or one that fits a raw ``.bin``'s."""
    fits = (tokenizer.vocab_size <= array.vocab_size if kind == RAW
            else tokenizer.vocab_size == array.vocab_size)
    if not fits:
        raise ConfigError(f"--tokenizer {tokenizer.name} has {tokenizer.vocab_size:,} ids, but "
                          f"the {kind}'s vocabulary is {array.vocab_size:,}; pass the tokenizer "
                          "that made it")

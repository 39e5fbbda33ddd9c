"""Text corpora: which files a ``--data`` file, directory or glob names, their documents, and
their tokenization into one token file.

A plain-text file (``.txt``, ``.md``, or ``.py`` for code corpora) is one document (UTF-8;
invalid bytes read as U+FFFD), a ``.jsonl`` line is
one document (its ``--text-field`` string; blank lines are skipped), a ``.parquet`` row is one
document (its ``--text-field`` column, read with pyarrow). Files are read in sorted path order
and their documents joined with the tokenizer's end-of-text id between them. Training
(:mod:`trainers.core.data`), ``trainers.tools.prepare_data`` and
``trainers.tools.train_tokenizer`` all read text through this module.

A file, directory or glob may be an object-store URL (``s3://bucket/corpus/``,
``'s3://bucket/**/*.jsonl'``): a directory is every object under the prefix, a glob is
expanded by listing the bucket, and files are streamed through fsspec
(:func:`trainers.runs.storage.location`).
"""

from __future__ import annotations

import glob
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from trainers.errors import ConfigError, MissingPathError
from trainers.formats.token_file import token_file_writer
from trainers.formats.tokenizer import TextTokenizer
from trainers.runs.storage import (
    RunPath,
    is_remote,
    is_url,
    location,
    scheme,
    store_reason,
)

PLAIN_SUFFIXES = (".txt", ".md", ".py")
TEXT_SUFFIXES = (*PLAIN_SUFFIXES, ".jsonl", ".parquet")
FIELD_SUFFIXES = (".jsonl", ".parquet")  # files that --text-field applies to
_TXT_BLOCK = 1 << 20  # characters of a .txt file tokenized at once (cut at a line end)
_BATCH = 256  # documents tokenized at once

Piece = tuple[str, bool]  # text, and whether a document ends after it
Progress = Callable[[int, int, int], None]  # (files done, files in all, tokens written)


def _is_glob(spec: str) -> bool:
    return any(c in spec for c in "*?[")


def resolve_files(specs: Sequence[str], flag: str = "--data") -> list[RunPath]:
    """The text files that ``specs`` (files, directories searched recursively, globs; local or
    URLs) name, sorted; ConfigError for a missing path, a directory or glob with no files, a
    file of another suffix than :data:`TEXT_SUFFIXES`, or a bucket that cannot be read."""
    files: list[RunPath] = []
    for spec in specs:
        found = _stored_files(spec, flag) if is_url(spec) else _local_files(spec)
        if found is None:
            raise MissingPathError(f"{flag} {spec}: no such file or directory; pass a text file, "
                                   "a directory or a glob of .txt, .jsonl or .parquet files")
        if not found and _is_glob(spec):
            raise MissingPathError(f"{flag} {spec}: the glob matches no files; pass a pattern "
                                   "that matches .txt, .jsonl or .parquet files")
        if not found:
            raise ConfigError(f"{flag} {spec}: the directory holds no files; pass a "
                              "directory of .txt, .jsonl or .parquet files")
        for path in found:
            if path.suffix not in TEXT_SUFFIXES:
                raise ConfigError(f"{flag} {spec}: {path} has an unknown suffix; pass only "
                                  ".txt, .md, .py, .jsonl or .parquet files (or a token file "
                                  "ending .bin)")
        files += found
    return files


def _local_files(spec: str) -> list[Path] | None:
    """The files local ``spec`` names, sorted; None if it names nothing."""
    if _is_glob(spec):
        return sorted(Path(p) for p in glob.glob(spec, recursive=True) if Path(p).is_file())
    if Path(spec).is_dir():
        return sorted(p for p in Path(spec).rglob("*")
                      if p.is_file() and not _hidden(p.relative_to(spec).parts))
    return [Path(spec)] if Path(spec).is_file() else None


def _stored_files(spec: str, flag: str) -> list[RunPath] | None:
    """The objects URL ``spec`` names (listed in the bucket), sorted, hidden names skipped
    as on disk; None if it names nothing. ConfigError (naming the fix) when the bucket cannot
    be read."""
    root = location(spec, flag)
    fs, key = root.fs, root.path.rstrip("/")
    try:
        if _is_glob(spec):
            names = sorted(n for n, e in fs.glob(key, detail=True).items() if e["type"] == "file"
                           and not _hidden(set(n.split("/")) - set(key.split("/"))))
        elif fs.isdir(key):
            names = sorted(n for n in fs.find(key)
                           if not _hidden(n[len(key):].strip("/").split("/")))
        else:
            names = [key] if fs.isfile(key) else None
    except FileNotFoundError:
        names = None
    except Exception as err:  # noqa: BLE001 - the store's client raises its own kinds
        reason = store_reason(root, write=False) or (str(err).splitlines() or [repr(err)])[0]
        raise ConfigError(f"{flag} {spec}: {reason}") from None
    if not names:  # a bucket that does not exist lists as nothing
        reason = store_reason(root, write=False)
        if reason is not None:
            raise ConfigError(f"{flag} {spec}: {reason}")
    return None if names is None else [location(f"{scheme(spec)}://{n}") for n in names]


def file_stats(files: Sequence[RunPath]) -> list[tuple[Any, ...]]:
    """What changes when a file is replaced, for cache keys: a local file's resolved path,
    size and modification time; an object's URL and the hash of what the store reports of it
    (size, ETag, modification time)."""
    return [(str(p), p.fs.ukey(p.path)) if is_remote(p)
            else (str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def _hidden(parts: Sequence[str]) -> bool:
    return any(part.startswith(".") for part in parts)


def pieces(path: RunPath, text_field: str) -> Iterator[Piece]:
    """The text of ``path`` in pieces, each with whether a document ends after it."""
    if path.suffix in PLAIN_SUFFIXES:
        yield from _txt_pieces(path)
    elif path.suffix == ".jsonl":
        yield from ((text, True) for text in _jsonl_texts(path, text_field))
    else:
        yield from ((text, True) for text in _parquet_texts(path, text_field))


def _txt_pieces(path: RunPath) -> Iterator[Piece]:
    with path.open("r", encoding="utf-8", errors="replace", newline="") as f:
        block = f.read(_TXT_BLOCK)
        while block:
            block += f.readline()  # end the piece at a line end
            following = f.read(_TXT_BLOCK)
            yield block, not following
            block = following


def records(path: RunPath) -> Iterator[tuple[int, Any]]:
    """``(number, record)`` of each record of a .jsonl (its line number; blank lines skipped)
    or .parquet file (its row number from 1; every column, read with pyarrow); ConfigError
    naming the line for one that is not JSON."""
    if path.suffix == ".parquet":
        number = 0
        for batch in _parquet_file(path).iter_batches():
            for row in batch.to_pylist():
                number += 1
                yield number, row
        return
    with path.open("r", encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError:
                raise ConfigError(f"{path}:{number}: not a JSON object; fix the line or drop "
                                  "it (a .jsonl file holds one object a line)") from None


def _jsonl_texts(path: RunPath, text_field: str) -> Iterator[str]:
    for number, record in records(path):
        text = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise ConfigError(f"{path}:{number}: no string field {text_field!r}; pass the "
                              "--text-field that holds the text, or fix the line")
        yield text


def _pyarrow(path: RunPath) -> Any:
    """The pyarrow module, with its parquet module imported; ConfigError naming the extra that
    installs it when it is not installed (only Parquet files need it)."""
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ConfigError(f"{path}: reading Parquet needs pyarrow, which is not installed; "
                          "pip install -e '.[parquet]', or pass .txt or .jsonl files") from None
    return pyarrow


def _parquet_file(path: RunPath) -> Any:
    """``path`` opened with pyarrow's ParquetFile; ConfigError if it does not read."""
    pa = _pyarrow(path)
    pq = pa.parquet

    try:
        return (pq.ParquetFile(path.path, filesystem=path.fs) if is_remote(path)
                else pq.ParquetFile(path))
    except (pa.ArrowException, OSError) as err:
        raise ConfigError(f"{path}: not a readable Parquet file ({err}); pass a Parquet "
                          "file written by pyarrow, pandas or datasets") from None


def _parquet_column(path: RunPath, text_field: str) -> Any:
    """``path`` opened with pyarrow, checked to hold string column ``text_field``."""
    pa = _pyarrow(path)

    parquet = _parquet_file(path)
    schema = parquet.schema_arrow
    if text_field not in schema.names or not (pa.types.is_string(schema.field(text_field).type)
                                              or pa.types.is_large_string(
                                                  schema.field(text_field).type)):
        raise ConfigError(f"{path}: no string column {text_field!r} (columns: "
                          f"{', '.join(schema.names)}); pass the --text-field that holds the text")
    return parquet


def _parquet_texts(path: RunPath, text_field: str) -> Iterator[str]:
    parquet = _parquet_column(path, text_field)
    for batch in parquet.iter_batches(columns=[text_field]):
        yield from (text for text in batch.column(0).to_pylist() if text is not None)


def check_corpus(files: Sequence[RunPath], text_field: str) -> None:
    """Raise ConfigError, naming the file (and line), unless every .jsonl line holds a string
    ``text_field`` and every .parquet file a string column of that name."""
    for path in files:
        if path.suffix == ".jsonl":
            for _ in _jsonl_texts(path, text_field):
                pass
        elif path.suffix == ".parquet":
            _parquet_column(path, text_field)


def check_not_empty(files: Sequence[RunPath], text_field: str, named: str) -> None:
    """Raise ConfigError unless ``files`` hold some text (reading up to the first that does);
    ``named``: how the command's arguments named them."""
    if not any(texts(files, text_field)):
        raise ConfigError(f"{named} is empty: no text to tokenize; pass non-empty files")


def texts(files: Sequence[RunPath], text_field: str) -> Iterator[str]:
    """Every piece of text in ``files`` (for training a tokenizer)."""
    for path in files:
        yield from (text for text, _ in pieces(path, text_field))


def tokenize_corpus(files: Sequence[RunPath], text_field: str, tokenizer: TextTokenizer,
                    target: RunPath, progress: Progress | None = None) -> int:
    """Tokenize ``files`` into token file ``target`` (written atomically), with
    ``tokenizer.end_of_text`` between documents; return the token count. ``progress`` is
    called after each batch and file. ConfigError, ``target`` left as it was, when the
    tokenizer makes no ids of the text."""
    import numpy as np  # here, not at the top: components import this module

    eot = (np.array([], dtype=np.int64) if tokenizer.end_of_text is None
           else np.array([tokenizer.end_of_text], dtype=np.int64))
    written = 0
    document_open = False  # a document has begun, so the next one needs a separator first
    with token_file_writer(target, tokenizer.vocab_size) as append:
        def flush(batch: list[Piece]) -> None:
            nonlocal written, document_open
            for (_, ends), ids in zip(batch, tokenizer.encode([t for t, _ in batch]),
                                      strict=True):
                if not document_open and written:
                    append(eot)
                    written += len(eot)
                append(ids)
                written += len(ids)
                document_open = not ends
            batch.clear()

        for done, path in enumerate(files, 1):
            batch: list[Piece] = []
            for piece in pieces(path, text_field):
                batch.append(piece)
                if len(batch) == _BATCH:
                    flush(batch)
                    if progress:
                        progress(done - 1, len(files), written)
            flush(batch)
            if progress:
                progress(done, len(files), written)
        if not written:  # raised inside the writer, which then keeps the target as it was
            raise ConfigError(f"the tokenizer ({tokenizer.name}) makes no ids of "
                              f"{', '.join(map(str, files))}; pass a tokenizer trained on such "
                              "text, or bytes")
    return written


def progress_line(stream: Any = sys.stderr, every_s: float = 1.0) -> Progress:
    """A :data:`Progress` that rewrites one ``files i/n, N tokens`` line on ``stream`` at most
    every ``every_s`` seconds (a new line each time when ``stream`` is no terminal), and at
    the end."""
    last = [0.0]
    terminal = stream.isatty()

    def report(done: int, total: int, tokens: int) -> None:
        now = time.monotonic()
        if done < total and now - last[0] < every_s:
            return
        last[0] = now
        start = "\r" if terminal else ""
        end = "\n" if done == total or not terminal else ""
        stream.write(f"{start}tokenized {done}/{total} files, {tokens:,} tokens{end}")
        stream.flush()

    return report

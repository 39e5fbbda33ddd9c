"""Token files and raw token arrays: where a ``--data`` file's token ids lie.

A token file is a 16-byte header, then little-endian token ids:

- ``TXTOKEN1``, the vocabulary size (uint32), 4 zero bytes: uint16 ids (every file written
  before uint32 ids existed, and every file whose vocabulary fits 65,536 ids);
- ``TXTOKEN2``, the vocabulary size (uint32), the id width in bytes (uint32, 2 or 4).

A raw array (nanoGPT's ``train.bin``) is ids only, no header; its dtype and vocabulary come
from ``--token-dtype`` and ``--vocab-size``. Written by ``python -m trainers.tools.prepare_data``
and the training run's text cache, read by :class:`trainers.core.data.TokenFileDataset`.

A file is a local path or an object-store URL (:func:`trainers.runs.storage.location`).
Checking one reads its size and its first bytes, never its body: a token file's ids are below
the vocabulary its header records (the writer encodes a tokenizer of that vocabulary); a raw
array's first :data:`PREFIX_BYTES` are checked against ``--vocab-size``, and every window a
run reads is checked again as it is read (:func:`check_ids`). Ids on an object store are read
by ranged requests, a micro-batch's windows at once (:class:`StoredIds`); nothing is
downloaded whole. Needs numpy
only, and only once ids are read or written, so components can check a ``--data`` file
without importing torch or numpy.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainers.errors import ConfigError, MissingPathError
from trainers.options.train_config import TOKEN_DTYPES
from trainers.runs.storage import RunPath, is_remote, location

if TYPE_CHECKING:  # numpy loads when ids are read or written: components import this module
    import numpy as np

TOKEN_FILE_HEADER = 16
MAGIC_UINT16 = b"TXTOKEN1"
MAGIC_SIZED = b"TXTOKEN2"
PREFIX_BYTES = 1 << 20  # what checking a raw array reads of it: its first MiB of ids

MAKE_ONE = "make one with `python -m trainers.tools.prepare_data TEXT OUT.bin`"


@dataclass(frozen=True)
class TokenArray:
    """``count`` ids of ``dtype`` at byte ``offset`` of ``path`` (``size`` bytes in all), all
    below ``vocab_size``."""

    path: RunPath
    dtype: np.dtype
    offset: int
    vocab_size: int
    size: int

    @property
    def count(self) -> int:
        return (self.size - self.offset) // self.dtype.itemsize

    def open(self) -> np.memmap | StoredIds:
        """The ids: memory-mapped read-only, or on an object store read a slice at a time."""
        if is_remote(self.path):
            return StoredIds(str(self.path), self.dtype, self.offset, self.count)
        import numpy as np

        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset,
                         shape=(self.count,))


class StoredIds:
    """The ids of a token file on an object store, sliced like an array: each slice is one
    ranged request, and :meth:`slices` reads many at once, concurrently. Holds the URL, not a
    connection: fsspec makes one file system per process, so DataLoader workers each open
    their own."""

    def __init__(self, url: str, dtype: np.dtype, offset: int, count: int) -> None:
        self.url, self.dtype, self.offset, self.count = url, dtype, offset, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: slice) -> np.ndarray:
        return self.slices([index])[0]

    def slices(self, indices: Sequence[slice]) -> list[np.ndarray]:
        """The ids of each forward slice, by concurrent ranged requests (``cat_ranges``): one
        round trip for a whole micro-batch."""
        import numpy as np

        size, starts, ends = self.dtype.itemsize, [], []
        for index in indices:
            start, stop, step = index.indices(self.count)
            if step != 1 or stop <= start:
                raise IndexError(f"{self.url}: only forward slices of ids read from a store")
            starts.append(self.offset + start * size)
            ends.append(self.offset + stop * size)
        path = location(self.url)
        data = path.fs.cat_ranges([path.path] * len(starts), starts, ends, on_error="raise")
        return [np.frombuffer(chunk, dtype=self.dtype) for chunk in data]


def dtype_for(vocab_size: int) -> np.dtype:
    """The narrowest id dtype that holds ids below ``vocab_size``: uint16 up to 65,536."""
    import numpy as np

    return np.dtype(TOKEN_DTYPES["uint16" if vocab_size <= 1 << 16 else "uint32"])


def _header(vocab_size: int) -> bytes:
    dtype = dtype_for(vocab_size)
    magic = MAGIC_UINT16 if dtype.itemsize == 2 else MAGIC_SIZED
    width = 0 if dtype.itemsize == 2 else dtype.itemsize
    return magic + vocab_size.to_bytes(4, "little") + width.to_bytes(4, "little")


@contextmanager
def token_file_writer(path: RunPath, vocab_size: int) -> Iterator[Callable[[np.ndarray], None]]:
    """Write a token file at ``path`` atomically: yields a function that appends ids; the file
    is written under a temporary name and takes ``path``'s on a clean exit (on an object store:
    written to a local temporary file, then uploaded, and an object appears whole), so a reader
    never sees half a file and writers racing for one path leave one whole file; on an error
    nothing is left."""
    if vocab_size >= 1 << 32:  # the header holds the vocabulary size in 4 bytes
        raise ConfigError(f"vocab size {vocab_size} does not fit a token file's header (at most "
                          f"{(1 << 32) - 1}); use a smaller tokenizer")
    import numpy as np

    dtype = dtype_for(vocab_size)
    if is_remote(path):
        handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial")
        os.close(handle)
        partial = Path(name)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    try:
        with open(partial, "wb") as out:
            out.write(_header(vocab_size))
            yield lambda tokens: out.write(np.ascontiguousarray(tokens, dtype=dtype).tobytes())
        if is_remote(path):
            path.fs.put_file(str(partial), path.path)
        else:
            os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def write_token_file(path: RunPath, tokens: np.ndarray, vocab_size: int) -> None:
    """Write ``tokens`` (ids below ``vocab_size``) as a token file for :class:`TokenFileDataset`."""
    with token_file_writer(path, vocab_size) as append:
        append(tokens)


def _read_prefix(path: RunPath, count: int) -> bytes:
    """The first ``count`` bytes of file ``path`` (fewer if it is shorter): one ranged request
    on an object store."""
    if is_remote(path):
        return path.fs.cat_file(path.path, start=0, end=count)
    with open(path, "rb") as f:
        return f.read(count)


def has_header(path: RunPath) -> bool:
    """Whether ``path`` is a readable file that starts like a token file."""
    try:
        return _read_prefix(path, 8) in (MAGIC_UINT16, MAGIC_SIZED)
    except OSError:
        return False


def read_header(path: RunPath) -> TokenArray:
    """The ids of token file ``path``; ConfigError if it is no token file. Reads the header
    and the size only."""
    size = _file_size(path)
    header = _read_prefix(path, TOKEN_FILE_HEADER)
    if len(header) < TOKEN_FILE_HEADER or header[:8] not in (MAGIC_UINT16, MAGIC_SIZED):
        raise ConfigError(f"--data {path}: no token-file header (not a token file); {MAKE_ONE}, "
                          "or for a raw array of ids (nanoGPT) pass --token-dtype uint16|uint32 "
                          "and --vocab-size N")
    vocab, width = (int.from_bytes(header[i:i + 4], "little") for i in (8, 12))
    if header[:8] == MAGIC_UINT16:
        width = 2
    dtype = {2: dtype_for(1 << 16), 4: dtype_for(1 << 17)}.get(width)
    if dtype is None:
        raise ConfigError(f"--data {path}: unknown id width {width} in the header; {MAKE_ONE}")
    return TokenArray(path, dtype, TOKEN_FILE_HEADER, vocab, size)


def raw_tokens(path: RunPath, token_dtype: str, vocab_size: int) -> TokenArray:
    """The ids of raw array ``path`` (no header) of ``token_dtype``, all below ``vocab_size``."""
    size = _file_size(path)
    if has_header(path):
        raise ConfigError(f"--data {path} is a token file with a header; drop --token-dtype "
                          "and --vocab-size (the header holds both)")
    import numpy as np

    dtype = np.dtype(TOKEN_DTYPES[token_dtype])
    if size % dtype.itemsize:
        raise ConfigError(f"--data {path}: {size} bytes are not whole {token_dtype} ids; pass "
                          "the --token-dtype the file was written with")
    return TokenArray(path, dtype, 0, vocab_size, size)


def check_raw_ids(array: TokenArray) -> None:
    """Raise ConfigError if the first :data:`PREFIX_BYTES` of a raw array hold an id at or
    beyond its ``--vocab-size`` (the rest is checked as it is read: :func:`check_ids`)."""
    import numpy as np

    head = _read_prefix(array.path, min(array.size, PREFIX_BYTES))
    ids = np.frombuffer(head[:len(head) - len(head) % array.dtype.itemsize], dtype=array.dtype)
    check_ids(array, ids, 0)


def check_ids(array: TokenArray, ids: np.ndarray, first: int) -> None:
    """Raise ConfigError if ``ids`` (those of ``array`` from position ``first`` on) hold one at
    or beyond its vocabulary: what keeps a wrong ``--vocab-size`` or ``--token-dtype``, or a
    damaged file, from indexing past the model's embedding."""
    if not len(ids) or int(ids.max()) < array.vocab_size:
        return
    top = int(ids.max())
    if array.offset:  # a token file: its header says what its writer's tokenizer made
        raise ConfigError(f"--data {array.path} holds id {top} at token "
                          f"{first + int(ids.argmax()):,}, beyond the vocabulary of "
                          f"{array.vocab_size} its header records; the file is damaged, "
                          "rewrite it with `python -m trainers.tools.prepare_data`")
    raise ConfigError(f"--data {array.path} holds id {top}, beyond --vocab-size "
                      f"{array.vocab_size}; pass --vocab-size {top + 1} or more (or the right "
                      "--token-dtype)")


def check_token_array(array: TokenArray, seq_len: int, model_vocab: int) -> None:
    """Raise ConfigError unless ``array`` trains a model of this vocabulary and context."""
    tokens = array.count
    if tokens == 0:
        raise ConfigError(f"--data {array.path}: the token file holds no tokens; tokenize a "
                          "non-empty text file")
    if array.vocab_size > model_vocab:
        raise ConfigError(f"--data {array.path}: vocab size {array.vocab_size} exceeds the "
                          f"model's {model_vocab}; pick a model with a larger vocabulary")
    if tokens // seq_len < 2:
        raise ConfigError(f"--data {array.path}: {tokens} tokens make fewer than two sequences "
                          f"of {seq_len}; use more text or a smaller --seq-len")


def _file_size(path: RunPath) -> int:
    """The size of file ``path``; MissingPathError if there is none, ConfigError if empty."""
    if is_remote(path):
        try:
            info = path.fs.info(path.path)
        except FileNotFoundError:
            info = {"type": "missing"}
        found, size = info["type"] == "file", int(info.get("size") or 0)
    else:
        found = path.is_file()
        size = path.stat().st_size if found else 0
    if not found:
        raise MissingPathError(f"--data {path}: no such file; {MAKE_ONE} or use synthetic")
    if size == 0:
        raise ConfigError(f"--data {path}: the file is empty; tokenize a non-empty text file")
    return size

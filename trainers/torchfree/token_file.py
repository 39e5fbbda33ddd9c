"""Token files and raw token arrays: where a ``--data`` file's token ids lie.

A token file is a 16-byte header, then little-endian token ids:

- ``TXTOKEN1``, the vocabulary size (uint32), 4 zero bytes: uint16 ids (every file written
  before uint32 ids existed, and every file whose vocabulary fits 65,536 ids);
- ``TXTOKEN2``, the vocabulary size (uint32), the id width in bytes (uint32, 2 or 4).

A raw array (nanoGPT's ``train.bin``) is ids only, no header; its dtype and vocabulary come
from ``--token-dtype`` and ``--vocab-size``. Written by ``python -m trainers.prepare_data``
and the training run's text cache, read by :class:`trainers.core.data.TokenFileDataset`.
Needs numpy only, and only once ids are read or written, so components can check a ``--data``
file without importing torch or numpy.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainers.torchfree.errors import ConfigError, MissingPathError

if TYPE_CHECKING:  # numpy loads when ids are read or written: components import this module
    import numpy as np

TOKEN_FILE_HEADER = 16
MAGIC_UINT16 = b"TXTOKEN1"
MAGIC_SIZED = b"TXTOKEN2"
TOKEN_DTYPES = {"uint16": "<u2", "uint32": "<u4"}  # numpy dtype strings of the id widths
_SCAN_CHUNK = 1 << 24  # ids per chunk when scanning a raw array for its largest id

MAKE_ONE = "make one with `python -m trainers.prepare_data TEXT OUT.bin`"


@dataclass(frozen=True)
class TokenArray:
    """``count`` ids of ``dtype`` at byte ``offset`` of ``path``, all below ``vocab_size``."""

    path: Path
    dtype: np.dtype
    offset: int
    vocab_size: int

    @property
    def count(self) -> int:
        return (self.path.stat().st_size - self.offset) // self.dtype.itemsize

    def open(self) -> np.memmap:
        """The ids, memory-mapped read-only."""
        import numpy as np

        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset,
                         shape=(self.count,))


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
def token_file_writer(path: Path, vocab_size: int) -> Iterator[Callable[[np.ndarray], None]]:
    """Write a token file at ``path`` atomically: yields a function that appends ids; the file
    is written under a temporary name and takes ``path``'s on a clean exit (a reader never
    sees half a file, and writers racing for one path leave one whole file); on an error it
    is removed."""
    if vocab_size >= 1 << 32:  # the header holds the vocabulary size in 4 bytes
        raise ConfigError(f"vocab size {vocab_size} does not fit a token file's header (at most "
                          f"{(1 << 32) - 1}); use a smaller tokenizer")
    import numpy as np

    dtype = dtype_for(vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    try:
        with open(partial, "wb") as out:
            out.write(_header(vocab_size))
            yield lambda tokens: out.write(np.ascontiguousarray(tokens, dtype=dtype).tobytes())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def write_token_file(path: Path, tokens: np.ndarray, vocab_size: int) -> None:
    """Write ``tokens`` (ids below ``vocab_size``) as a token file for :class:`TokenFileDataset`."""
    with token_file_writer(path, vocab_size) as append:
        append(tokens)


def has_header(path: Path) -> bool:
    """Whether ``path`` is a readable file that starts like a token file."""
    try:
        with open(path, "rb") as f:
            return f.read(8) in (MAGIC_UINT16, MAGIC_SIZED)
    except OSError:
        return False


def read_header(path: Path) -> TokenArray:
    """The ids of token file ``path``; ConfigError if it is no token file."""
    _check_exists(path)
    with open(path, "rb") as f:
        header = f.read(TOKEN_FILE_HEADER)
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
    return TokenArray(path, dtype, TOKEN_FILE_HEADER, vocab)


def raw_tokens(path: Path, token_dtype: str, vocab_size: int) -> TokenArray:
    """The ids of raw array ``path`` (no header) of ``token_dtype``, all below ``vocab_size``."""
    _check_exists(path)
    if has_header(path):
        raise ConfigError(f"--data {path} is a token file with a header; drop --token-dtype "
                          "and --vocab-size (the header holds both)")
    import numpy as np

    dtype = np.dtype(TOKEN_DTYPES[token_dtype])
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise ConfigError(f"--data {path}: {size} bytes are not whole {token_dtype} ids; pass "
                          "the --token-dtype the file was written with")
    return TokenArray(path, dtype, 0, vocab_size)


def largest_id(array: TokenArray) -> int:
    """The largest id in ``array`` (-1 if empty), scanned memory-mapped in chunks."""
    ids = array.open()
    return max((int(ids[i:i + _SCAN_CHUNK].max()) for i in range(0, len(ids), _SCAN_CHUNK)),
               default=-1)


def check_raw_ids(array: TokenArray) -> None:
    """Raise ConfigError if a raw array holds an id at or beyond its ``--vocab-size``."""
    top = largest_id(array)
    if top >= array.vocab_size:
        raise ConfigError(f"--data {array.path} holds id {top}, beyond --vocab-size "
                          f"{array.vocab_size}; pass --vocab-size {top + 1} or more (or the "
                          "right --token-dtype)")


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


def _check_exists(path: Path) -> None:
    if not path.is_file():
        raise MissingPathError(f"--data {path}: no such file; {MAKE_ONE} or use synthetic")
    if path.stat().st_size == 0:
        raise ConfigError(f"--data {path}: the file is empty; tokenize a non-empty text file")

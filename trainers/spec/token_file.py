"""The token file format: a 16-byte header, then little-endian uint16 token ids.

Header: the magic ``TXTOKEN1`` (8 bytes), the vocabulary size (uint32), 4 reserved bytes.
Written by ``python -m trainers.prepare_data``, read by
:class:`trainers.core.data.TokenFileDataset`.
Needs numpy only, so components can check a ``--data`` file without importing torch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trainers.spec.errors import ConfigError

TOKEN_FILE_MAGIC = b"TXTOKEN1"
TOKEN_FILE_HEADER = 16
TOKEN_DTYPE = np.uint16


def write_token_file(path: Path, tokens: np.ndarray, vocab_size: int) -> None:
    """Write ``tokens`` (ids below ``vocab_size``) as a token file for :class:`TokenFileDataset`."""
    if vocab_size > np.iinfo(TOKEN_DTYPE).max + 1:
        raise ValueError(f"vocab size {vocab_size} does not fit {np.dtype(TOKEN_DTYPE).name}")
    header = TOKEN_FILE_MAGIC + np.array([vocab_size, 0], dtype="<u4").tobytes()
    with open(path, "wb") as out:
        out.write(header)
        out.write(np.ascontiguousarray(tokens, dtype="<u2").tobytes())


def read_header(path: Path) -> int:
    """The vocab size in ``path``'s header; ConfigError if it is no token file."""
    if not path.is_file():
        raise ConfigError(f"--data {path}: no such file; make one with "
                          "`python -m trainers.prepare_data TEXT_FILE OUT.bin` or use synthetic")
    with open(path, "rb") as f:
        header = f.read(TOKEN_FILE_HEADER)
    if not header:
        raise ConfigError(f"--data {path}: the file is empty; tokenize a non-empty text file")
    if len(header) < TOKEN_FILE_HEADER or header[:8] != TOKEN_FILE_MAGIC:
        raise ConfigError(f"--data {path}: not a token file; make one with "
                          "`python -m trainers.prepare_data TEXT_FILE OUT.bin`")
    return int(np.frombuffer(header[8:12], dtype="<u4")[0])


def check_token_file(path: Path, seq_len: int, model_vocab: int) -> None:
    """Raise ConfigError unless ``path`` is a token file that trains a model of this shape."""
    vocab = read_header(path)
    tokens = (path.stat().st_size - TOKEN_FILE_HEADER) // np.dtype(TOKEN_DTYPE).itemsize
    if tokens == 0:
        raise ConfigError(f"--data {path}: the token file holds no tokens; tokenize a "
                          "non-empty text file")
    if vocab > model_vocab:
        raise ConfigError(f"--data {path}: vocab size {vocab} exceeds the model's "
                          f"{model_vocab}; pick a model with a larger vocabulary")
    if tokens // seq_len < 2:
        raise ConfigError(f"--data {path}: {tokens} tokens make fewer than two sequences of "
                          f"{seq_len}; use more text or a smaller --seq-len")

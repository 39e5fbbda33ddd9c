"""Text to token ids and back, as a run's ``tokenizer`` setting says.

``bytes`` (the default, and what a run without the setting used): every UTF-8 byte is one
token, ids 0..255. Anything else is the path of a Hugging Face ``tokenizer.json``, read with
the ``tokenizers`` package (the ``hf`` extra), imported only then.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from trainers.spec.errors import ConfigError

BYTES = "bytes"


class Codec(Protocol):
    """Encodes text to ids below ``vocab_size`` and decodes ids back to text."""

    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteCodec:
    """UTF-8 bytes as ids; bytes that are not valid UTF-8 decode to U+FFFD."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


class TokenizerFileCodec:
    """A ``tokenizers.Tokenizer`` read from a tokenizer.json, without special tokens added."""

    def __init__(self, path: Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ConfigError(f"reading the tokenizer {path} needs the tokenizers package; "
                              "pip install -e '.[hf]'") from None
        self.path = path
        self.tokenizer = Tokenizer.from_file(str(path))
        self.vocab_size = self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


def tokenizer_file(config: dict[str, Any]) -> Path | None:
    """The tokenizer.json of a run with TrainConfig ``config`` (a dict), None for a byte-level
    run (``tokenizer`` bytes or absent); ConfigError if the file is gone."""
    setting = str(config.get("tokenizer", BYTES))
    if setting == BYTES:
        return None
    path = Path(setting)
    if not path.is_file():
        raise ConfigError(f"the run's tokenizer {setting} is not a file here; run from the "
                          "directory the run was started in, or restore the file")
    return path


def run_codec(config: dict[str, Any]) -> Codec:
    """The codec of a run with TrainConfig ``config`` (a dict); see :func:`tokenizer_file`."""
    path = tokenizer_file(config)
    return ByteCodec() if path is None else TokenizerFileCodec(path)

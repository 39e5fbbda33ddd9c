"""The tokenizers ``--tokenizer`` names: ``bytes`` or a Hugging Face ``tokenizer.json``.

``bytes``: every UTF-8 byte of the text is one id (0-255, vocabulary 256); documents are
separated by id 255 (the byte 0xFF, which UTF-8 text never contains), so the separator costs
no vocabulary entry. A ``tokenizer.json`` (a local path or an object-store URL,
:func:`trainers.runs.storage.location`) is read and loaded with
``tokenizers.Tokenizer.from_str``; documents are separated by its end-of-text token (the first
of :data:`END_OF_TEXT` it has), or by nothing if it has none.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainers.errors import ConfigError, MissingPathError
from trainers.runs.storage import location

if TYPE_CHECKING:  # numpy loads when text is encoded: components import this module
    import numpy as np

BYTES = "bytes"
BYTES_END_OF_TEXT = 0xFF
# The smallest byte-level BPE vocabulary (trainers.tools.train_tokenizer): the 256 byte symbols and
# the end-of-text token.
BYTE_LEVEL_VOCAB = 257
END_OF_TEXT = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[EOS]")


@dataclass(frozen=True)
class TextTokenizer:
    """Text to ids: ``vocab_size`` ids, ``end_of_text`` (or None) between documents, and an
    ``identity`` that changes whenever the ids for some text may change (for caches)."""

    name: str
    vocab_size: int
    end_of_text: int | None
    identity: str
    hf: Any = None  # the tokenizers.Tokenizer, or None for bytes

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The ids of each text (no special tokens added)."""
        import numpy as np

        if self.hf is None:
            return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]
        return [np.asarray(e.ids, dtype=np.int64)
                for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (bytes that are not valid UTF-8 decode to U+FFFD)."""
        if self.hf is None:
            return bytes(ids).decode("utf-8", errors="replace")
        return self.hf.decode(list(ids), skip_special_tokens=False)


def load_tokenizer(spec: str) -> TextTokenizer:
    """The tokenizer ``--tokenizer spec`` names; ConfigError if it does not load."""
    if spec == BYTES:
        return TextTokenizer(BYTES, 256, BYTES_END_OF_TEXT, BYTES)
    path = location(spec, "--tokenizer")
    if not path.is_file():
        raise MissingPathError(f"--tokenizer {spec}: no such file; pass bytes or the path of a "
                               "tokenizer.json (train one with `python -m "
                               "trainers.tools.train_tokenizer`)")
    from tokenizers import Tokenizer  # imported here: only text sources need it

    data = path.read_bytes()
    try:
        hf = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as err:  # noqa: BLE001 - tokenizers raises plain Exceptions
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"--tokenizer {spec} does not load ({reason}); pass a Hugging Face "
                          "tokenizer.json or bytes") from None
    vocab = max(hf.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    eot = next((hf.token_to_id(t) for t in END_OF_TEXT if hf.token_to_id(t) is not None), None)
    digest = hashlib.sha256(data).hexdigest()
    return TextTokenizer(str(path), vocab, eot, f"tokenizer.json:{digest}", hf)


def check_tokenizer_fits(tokenizer: TextTokenizer, model_vocab: int) -> None:
    """Raise ConfigError if ``tokenizer`` makes ids the model has no embedding for."""
    if tokenizer.vocab_size > model_vocab:
        smaller = ("train a smaller tokenizer" if model_vocab >= BYTE_LEVEL_VOCAB else
                   "pass --tokenizer bytes (one id per byte)")
        raise ConfigError(f"--tokenizer {tokenizer.name} has {tokenizer.vocab_size:,} ids, more "
                          f"than the model's vocabulary of {model_vocab:,}; pick a model with a "
                          f"larger vocabulary or {smaller}")

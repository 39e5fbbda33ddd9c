"""Instruction and chat data: samples whose loss counts only the completion.

A ``.jsonl`` line or ``.parquet`` row is one sample, in one of two formats
(``--data-format``, or detected from the first record):

- ``prompt_completion``: string fields ``--prompt-field`` and ``--completion-field``; the sample
  is the prompt's tokens, then the completion's and the tokenizer's end-of-text id; the
  completion and the end-of-text id are in the loss.
- ``chat``: ``--messages-field`` holds a list of ``{"role", "content"}`` turns, rendered with a
  chat template (``--chat-template FILE``; else the ``chat_template`` of the
  ``tokenizer_config.json`` or ``chat_template.jinja`` beside ``--tokenizer``; else
  :data:`DEFAULT_TEMPLATE`) by transformers' ``render_jinja_template``, the renderer behind
  ``apply_chat_template``. Each assistant turn's text, as the template renders it after the
  generation prompt (its end marker included), is in the loss; everything else is not, and
  turns after the last assistant turn are left out, and the sample ends with the end-of-text
  id, in the loss (the model learns to stop).

Texts are tokenized segment by segment (a segment is in the loss or not as a whole), so the
mask is exact for any tokenizer. Truncation rule: a sample keeps its first ``--seq-len + 1``
tokens (inputs and shifted targets). A sample left with no completion token (its prompt is
longer than ``--seq-len`` tokens) is skipped (``--long-samples skip``, :func:`kept_samples`: the
same samples on every rank, one line says how many) or an error naming its record
(``--long-samples error``); a run it would leave fewer than two samples is refused. The
samples are kept untruncated in one ``.npz`` cache (:func:`write_samples`), so ``--seq-len``
can change without tokenizing again.

Needs numpy, and transformers' chat-template renderer (jinja2) for chat data, only once
samples are tokenized: components import this module to check data before submitting.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainers.errors import ConfigError
from trainers.formats.corpus import FIELD_SUFFIXES, file_stats, records
from trainers.formats.tokenizer import TextTokenizer
from trainers.options.model_names import model_kind
from trainers.runs.storage import RunPath, location, write_bytes_atomic

if TYPE_CHECKING:
    import numpy as np

    from trainers.options.train_config import TrainConfig

TEXT, PROMPT_COMPLETION, CHAT = "text", "prompt_completion", "chat"
SKIP, ERROR = "skip", "error"  # --long-samples
CACHE_VERSION = 1  # bump when the same records and options tokenize differently
# A ChatML-style template for tokenizers without one: the three roles it knows, each turn
# "<|im_start|>ROLE\nCONTENT<|im_end|>\n"; any other role is refused.
DEFAULT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('the chat template knows the roles system, user and assistant, not '"
    " + message['role']) }}{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
Segment = tuple[str, bool]  # text, and whether its tokens are in the loss


@dataclass(frozen=True)
class Skipped:
    """What :func:`kept_samples` left out: ``count`` of ``total`` samples whose whole
    completion ``--seq-len`` ``seq_len`` cuts; ``longest`` is the longest of their prompts in
    tokens, which is the ``--seq-len`` that keeps them all."""

    count: int
    total: int
    seq_len: int
    longest: int

    def line(self) -> str:
        """The one line a run prints about them."""
        return (f"skipped {self.count} of {self.total} samples: --seq-len {self.seq_len} cuts "
                f"their whole completion (the longest prompt is {self.longest} tokens); "
                f"--seq-len {self.longest} keeps them all, --long-samples error refuses them")


@dataclass(frozen=True)
class Samples:
    """Tokenized samples, untruncated: sample ``i`` is ``ids[starts[i]:starts[i + 1]]`` and
    ``loss[j]`` says whether token ``j`` is a target in the loss. ``skipped``: the samples of
    the source :func:`kept_samples` left out of these, if any."""

    ids: np.ndarray
    loss: np.ndarray
    starts: np.ndarray
    vocab_size: int
    skipped: Skipped | None = None

    def __len__(self) -> int:
        return len(self.starts) - 1

    def lengths(self) -> np.ndarray:
        return self.starts[1:] - self.starts[:-1]


def data_format(cfg: TrainConfig, files: Sequence[RunPath]) -> str:
    """``--data-format``, or, for ``auto``, the format the first .jsonl/.parquet record has:
    chat with ``--messages-field``, prompt_completion with ``--prompt-field``, else text.
    ConfigError when instruction data is named for plain-text files."""
    fielded = [p for p in files if p.suffix in FIELD_SUFFIXES]
    if cfg.data_format not in ("auto", TEXT) and len(fielded) < len(files):
        plain = next(p for p in files if p.suffix not in FIELD_SUFFIXES)
        raise ConfigError(f"--data-format {cfg.data_format} reads .jsonl or .parquet records, "
                          f"and {plain} is plain text; pass only .jsonl/.parquet files or "
                          "--data-format text")
    if cfg.data_format != "auto":
        return cfg.data_format
    first = next((record for path in fielded for _, record in records(path)), None)
    if not fielded or not isinstance(first, dict) or len(fielded) < len(files):
        return TEXT
    if cfg.messages_field in first:
        return CHAT
    return PROMPT_COMPLETION if cfg.prompt_field in first else TEXT


def check_format_options(cfg: TrainConfig, fmt: str) -> None:
    """ConfigError for a field or template option that format ``fmt`` does not read."""
    defaults = {"messages_field": ("messages", CHAT), "chat_template": ("", CHAT),
                "prompt_field": ("prompt", PROMPT_COMPLETION),
                "completion_field": ("completion", PROMPT_COMPLETION)}
    for option, (default, owner) in defaults.items():
        if getattr(cfg, option) != default and fmt != owner:
            flag = "--" + option.replace("_", "-")
            raise ConfigError(f"{flag} applies to {owner} data, and --data {cfg.data} is read "
                              f"as {fmt}; drop {flag} or pass --data-format {owner}")


def packs(cfg: TrainConfig) -> bool:
    """Whether instruction samples are packed: ``--batching pack``, or ``auto`` where the
    model takes packed samples' positions: a built-in or ``hf:`` model with sdpa attention,
    whole (``--pp 1``: pipeline stages pass hidden states only) with whole heads (``--tp
    1``). Packing measured 1.11x padding's sample tokens/s (docs/finetuning.md)."""
    if cfg.batching != "auto":
        return cfg.batching == "pack"
    return (cfg.pp == 1 and cfg.tp == 1 and cfg.attention == "sdpa"
            and model_kind(cfg.model) != "module")


def check_batching(cfg: TrainConfig, fmt: str) -> None:
    """ConfigError for a ``--batching`` given with data that is not instruction samples, or
    ``pack`` where :func:`packs` could not pack."""
    if cfg.batching == "auto":
        return
    if fmt == TEXT:
        raise ConfigError(f"--batching applies to instruction and chat samples, and --data "
                          f"{cfg.data} is read as text (its windows are full already); drop "
                          "--batching")
    if cfg.batching != "pack":
        return
    if model_kind(cfg.model) == "module":
        raise ConfigError(f"--batching pack needs a model whose forward takes packed "
                          f"samples' positions, and --model {cfg.model} is your own; pass "
                          "--batching pad")
    if cfg.attention != "sdpa":
        raise ConfigError(f"--batching pack masks attention to each sample with sdpa, not "
                          f"--attention {cfg.attention}; pass --attention sdpa or --batching "
                          "pad")
    if cfg.pp > 1 or cfg.tp > 1:
        raise ConfigError(f"--batching pack needs the whole model in each rank's forward, and "
                          f"--pp {cfg.pp} --tp {cfg.tp} splits it; pass --batching pad")


def check_long_samples(cfg: TrainConfig, fmt: str) -> None:
    """ConfigError for a ``--long-samples`` given with data that is not instruction samples."""
    if cfg.long_samples != SKIP and fmt == TEXT:
        raise ConfigError(f"--long-samples applies to instruction and chat samples, and --data "
                          f"{cfg.data} is read as text (its windows are cut, never skipped); "
                          "drop --long-samples")


def chat_template(cfg: TrainConfig) -> str:
    """The chat template's source: ``--chat-template``'s file, else the tokenizer's own, else
    :data:`DEFAULT_TEMPLATE`."""
    if cfg.chat_template:
        path = location(cfg.chat_template, "--chat-template")
        if not path.is_file():
            raise ConfigError(f"--chat-template {cfg.chat_template}: no such file; pass a "
                              "Jinja template file, or drop it for the tokenizer's own")
        return path.read_text(encoding="utf-8")
    if cfg.tokenizer != "bytes":
        folder = location(cfg.tokenizer, "--tokenizer").parent
        if (folder / "chat_template.jinja").is_file():
            return (folder / "chat_template.jinja").read_text(encoding="utf-8")
        config = folder / "tokenizer_config.json"
        if config.is_file():
            template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
            if isinstance(template, str):
                return template
    return DEFAULT_TEMPLATE


def _render(template: str, turns: list[dict[str, Any]], generation_prompt: bool) -> str:
    from jinja2 import TemplateError
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        rendered, _ = render_jinja_template([turns], chat_template=template,
                                            add_generation_prompt=generation_prompt)
    except TemplateError as err:
        raise ConfigError(f"the chat template refuses it: {err}") from None
    return rendered[0]


def chat_segments(turns: list[dict[str, Any]], template: str) -> list[Segment]:
    """The rendered conversation ``turns`` in segments: each assistant turn's rendering after
    the generation prompt in the loss, the text before it not; the text after the last
    assistant turn is left out. ConfigError (without the record's name) for a turn the
    template does not render, a template whose renderings of fewer turns are not prefixes of
    more, or a conversation without an assistant turn."""
    segments: list[Segment] = []
    done = ""
    for index, turn in enumerate(turns):
        upto = _render(template, turns[:index + 1], False)
        content = turn["content"]
        if not upto.startswith(done) or (content.strip() and content not in upto[len(done):]):
            raise ConfigError(f"the chat template does not render role {turn['role']!r} (turn "
                              f"{index + 1}); pass a --chat-template that knows it, or drop "
                              "such turns")
        if turn["role"] == "assistant":
            prompt = _render(template, turns[:index], True)
            if not (prompt.startswith(done) and upto.startswith(prompt)):
                raise ConfigError("the chat template's rendering of a conversation's first "
                                  "turns is not the start of its rendering of more turns; "
                                  "pass a --chat-template that renders turn by turn")
            segments += [(prompt[len(done):], False), (upto[len(prompt):], True)]
            done = upto
    if not any(in_loss for _, in_loss in segments):
        raise ConfigError("the conversation has no assistant turn, so nothing to learn; "
                          "drop it or add the assistant's reply")
    return segments


def _turns(record: Any, field: str) -> list[dict[str, Any]] | None:
    turns = record.get(field) if isinstance(record, dict) else None
    if not isinstance(turns, list) or not all(
            isinstance(t, dict) and isinstance(t.get("role"), str)
            and isinstance(t.get("content"), str) for t in turns):
        return None
    return turns


def record_segments(record: Any, fmt: str, cfg: TrainConfig,
                    template: str) -> list[Segment]:
    """The segments of one record in format ``fmt``; ConfigError (without the record's name)
    for a record without the named fields."""
    if fmt == CHAT:
        turns = _turns(record, cfg.messages_field)
        if turns is None:
            raise ConfigError(f"no field {cfg.messages_field!r} holding a list of "
                              "{role, content} turns; pass the --messages-field that holds "
                              "them, or --data-format")
        return chat_segments(turns, template)
    fields = [cfg.prompt_field, cfg.completion_field]
    texts = [record.get(f) if isinstance(record, dict) else None for f in fields]
    for flag, name, text in zip(("--prompt-field", "--completion-field"), fields, texts,
                                strict=True):
        if not isinstance(text, str):
            raise ConfigError(f"no string field {name!r}; pass the {flag} that holds it, or "
                              "--data-format")
    return [(texts[0], False), (texts[1], True)]


def encode(segments: list[Segment], tokenizer: TextTokenizer) -> tuple[np.ndarray, np.ndarray]:
    """The ids of ``segments`` and whether each is in the loss, with the end-of-text id (if
    the tokenizer has one) last, in the loss."""
    import numpy as np

    pieces = tokenizer.encode([text for text, _ in segments])
    flags = [np.full(len(ids), in_loss) for ids, (_, in_loss) in zip(pieces, segments,
                                                                       strict=True)]
    if tokenizer.end_of_text is not None:
        pieces.append(np.array([tokenizer.end_of_text]))
        flags.append(np.array([True]))
    return (np.concatenate(pieces).astype(np.int64), np.concatenate(flags).astype(bool))


def samples_of(files: Sequence[RunPath], fmt: str, cfg: TrainConfig,
               tokenizer: TextTokenizer) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """``(where, ids, loss)`` of every record of ``files``, ``where`` naming its file and
    line/row; ConfigError naming the record for any that cannot be a sample."""
    template = chat_template(cfg) if fmt == CHAT else ""
    for path in files:
        for number, record in records(path):
            where = f"{path}:{number}"
            try:
                segments = record_segments(record, fmt, cfg, template)
            except ConfigError as err:
                raise ConfigError(f"{where}: {err}") from None
            yield where, *encode(segments, tokenizer)


def tokenize_samples(files: Sequence[RunPath], fmt: str, cfg: TrainConfig,
                     tokenizer: TextTokenizer) -> Samples:
    """Every sample of ``files``, untruncated; with ``--long-samples error`` each checked
    against ``--seq-len`` (:func:`check_window`, naming the first record it refuses).
    ConfigError naming a sample with no target in the loss (nothing after its first token),
    which no ``--seq-len`` could train on, or for fewer than two samples."""
    import numpy as np

    ids, loss, starts = [], [], [0]
    for where, sample_ids, sample_loss in samples_of(files, fmt, cfg, tokenizer):
        if not sample_loss[1:].any():
            raise ConfigError(f"{where}: the sample has nothing to learn (no completion token "
                              "after its first token); give it a completion or drop it")
        if cfg.long_samples == ERROR:
            check_window(sample_loss, cfg.seq_len, where)
        ids.append(sample_ids)
        loss.append(sample_loss)
        starts.append(starts[-1] + len(sample_ids))
    if len(starts) < 3:
        raise ConfigError(f"--data {cfg.data} holds {len(starts) - 1} samples; pass two or "
                          "more (one is held out for evaluation)")
    return Samples(np.concatenate(ids), np.concatenate(loss), np.asarray(starts, np.int64),
                   tokenizer.vocab_size)


def check_window(loss: np.ndarray, seq_len: int, where: str) -> None:
    """ConfigError unless a sample with loss flags ``loss`` keeps a target in the loss once
    cut to ``seq_len + 1`` tokens (the truncation rule: the first ones are kept); ``loss``
    has a target in the loss somewhere (:func:`tokenize_samples`)."""
    if not loss[1:seq_len + 1].any():
        prompt = int(loss.argmax())
        raise ConfigError(f"{where}: --seq-len {seq_len} cuts the whole completion (it starts "
                          f"after {prompt} tokens); raise --seq-len or shorten the prompt")


def prompt_lengths(samples: Samples) -> np.ndarray:
    """Each sample's prompt length in tokens: the position of its first target in the loss
    (its first token in the loss after its first token). ``--seq-len`` N keeps a target of
    the sample (:func:`check_window`) exactly when this is N or less. Every sample of
    :func:`tokenize_samples` has such a target; one without would count as longer than any
    ``--seq-len``."""
    import numpy as np

    firsts = samples.starts[:-1]
    counted = samples.loss.copy()
    counted[firsts] = False  # a sample's first token is an input, never a target
    hits = np.flatnonzero(counted)
    owners = np.searchsorted(samples.starts, hits, side="right") - 1
    found, first_hit = np.unique(owners, return_index=True)
    lengths = np.full(len(samples), np.iinfo(np.int64).max)
    lengths[found] = hits[first_hit] - firsts[found]
    return lengths


def check_samples(samples: Samples, seq_len: int, where: str) -> None:
    """:func:`check_window` for every sample of a cache (``where`` names it): ConfigError
    naming the first sample whose whole completion ``seq_len`` cuts."""
    import numpy as np

    cut = np.flatnonzero(prompt_lengths(samples) > seq_len)
    if len(cut):
        index = int(cut[0])
        span = slice(samples.starts[index], samples.starts[index + 1])
        check_window(samples.loss[span], seq_len, f"{where} sample {index + 1}")


def kept_samples(samples: Samples, cfg: TrainConfig, where: str) -> Samples:
    """``samples`` less those whose whole completion ``--seq-len`` cuts, in the same order,
    with what was left out as their ``skipped`` (None: nothing). A function of ``samples`` and
    ``--seq-len`` alone, so every rank keeps the same samples, and a resumed run the ones the
    run it resumes trained on. ``--long-samples error`` refuses any such sample instead
    (:func:`check_samples`; ``where`` names ``samples``). ConfigError when fewer than two
    samples would be left (one is held out for evaluation), naming the ``--seq-len`` that
    keeps them all."""
    import numpy as np

    if cfg.long_samples == ERROR:
        check_samples(samples, cfg.seq_len, where)
        return samples
    prompts = prompt_lengths(samples)
    cut = prompts > cfg.seq_len
    count, total = int(cut.sum()), len(samples)
    if not count:
        return samples
    longest = int(prompts.max())
    if total - count < 2:
        which = f"all {total}" if count == total else f"{count} of the {total}"
        left = "" if count == total else ", leaving one (two are needed: one is held out)"
        raise ConfigError(f"--seq-len {cfg.seq_len} cuts the whole completion of {which} "
                          f"samples of --data {cfg.data}{left}; pass --seq-len {longest} or "
                          "more, or shorten the prompts")
    kept = ~cut
    lengths = samples.lengths()[kept]
    tokens = np.repeat(kept, samples.lengths())
    return Samples(samples.ids[tokens], samples.loss[tokens],
                   np.concatenate([[0], np.cumsum(lengths)]),
                   samples.vocab_size, Skipped(count, total, cfg.seq_len, longest))


def cache_path(output_dir: str, files: Sequence[RunPath], tokenizer: TextTokenizer,
               fmt: str, cfg: TrainConfig) -> RunPath:
    """``<output_dir>/data/samples-<key>.npz``: the key changes with the files (as the text
    cache's), the tokenizer, the format, its fields and the chat template's source."""
    stats = file_stats(files)
    template = chat_template(cfg) if fmt == CHAT else ""
    fields = ([cfg.messages_field] if fmt == CHAT
              else [cfg.prompt_field, cfg.completion_field])
    key = json.dumps([CACHE_VERSION, stats, tokenizer.identity, fmt, fields, template])
    name = f"samples-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"
    return location(output_dir, "--output-dir") / "data" / name


def write_samples(path: RunPath, samples: Samples) -> None:
    """Write ``samples`` to ``path`` atomically (an .npz of ids, loss flags and starts)."""
    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, ids=samples.ids, loss=samples.loss, starts=samples.starts,
             vocab_size=np.int64(samples.vocab_size))
    write_bytes_atomic(path, buffer.getvalue())


def read_samples(path: RunPath) -> Samples:
    """The samples :func:`write_samples` wrote at ``path``."""
    import numpy as np

    with np.load(io.BytesIO(path.read_bytes())) as stored:
        return Samples(stored["ids"], stored["loss"], stored["starts"],
                       int(stored["vocab_size"]))

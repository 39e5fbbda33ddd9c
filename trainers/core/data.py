"""Training data: built-in learnable synthetic sequences and token ids (a token file, a raw
.bin, or a text corpus tokenized once into a cached token file), memory-mapped from a local
file or read from an object store one window per ranged request; and instruction or chat
samples (:mod:`trainers.formats.instruction_data`), one per sequence, padded.

The datasets return ``(inputs, targets)`` shifted by one: windows of ``seq_len`` tokens cut
from the ids, or a sample with its targets :data:`~trainers.core.loss.IGNORE` where they are
not in the loss (prompts, padding), padded and cut to the batch's longest sample, or packed
samples with their positions. :mod:`trainers.core.batch_stream` draws the batches.
"""

from __future__ import annotations

import bisect
import math

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from trainers.core.distributed import DistEnv
from trainers.core.loss import IGNORE
from trainers.formats.corpus import progress_line, tokenize_corpus
from trainers.formats.data_source import (
    SYNTHETIC,
    TEXT,
    data_kind,
    instruction_source,
    text_source,
    token_array,
)
from trainers.formats.instruction_data import (
    Samples,
    kept_samples,
    packs,
    read_samples,
    tokenize_samples,
    write_samples,
)
from trainers.formats.token_file import (
    StoredIds,
    TokenArray,
    check_ids,
    check_token_array,
    read_header,
)
from trainers.options.train_config import TrainConfig, model_vocab
from trainers.runs.storage import is_remote

# (inputs, targets), or (inputs, targets, positions) of packed samples (PackedDataset)
Batch = tuple[torch.Tensor, ...]


class MarkovChainDataset(Dataset[Batch]):
    """Sequences sampled from a fixed sparse random Markov chain over ``vocab_size`` tokens.

    Every token has ``branching`` possible successors with probabilities drawn uniformly from
    the simplex, so the best achievable loss is the chain's entropy rate (at most
    ln(branching), far below ln(vocab_size)): a model that learns drives its loss from
    ln(vocab) towards that floor.
    The chain depends only on ``vocab_size`` and ``branching``; ``seed`` picks the sequences.
    """

    def __init__(self, vocab_size: int, seq_len: int, num_samples: int, seed: int,
                 branching: int = 4) -> None:
        chain_gen = torch.Generator().manual_seed(vocab_size * 1000 + branching)
        self.successors = torch.stack(
            [torch.randperm(vocab_size, generator=chain_gen)[:branching]
             for _ in range(vocab_size)])
        self.probs = _uniform_simplex(vocab_size, branching, chain_gen)
        gen = torch.Generator().manual_seed(seed)
        tokens = torch.empty(num_samples, seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(vocab_size, (num_samples,), generator=gen)
        for t in range(seq_len):
            current = tokens[:, t]
            choice = torch.multinomial(self.probs[current], 1, generator=gen).squeeze(1)
            tokens[:, t + 1] = self.successors[current, choice]
        self.tokens = tokens
        self.vocab_size = vocab_size

    def entropy_rate(self) -> float:
        """The chain's entropy rate in nats per token: the lowest loss any model can reach."""
        probs = self.probs.double()
        stationary = torch.full((self.vocab_size,), 1.0 / self.vocab_size, dtype=torch.float64)
        for _ in range(1000):  # power iteration on the sparse transition matrix
            stationary = torch.zeros_like(stationary).index_add_(
                0, self.successors.flatten(), (stationary[:, None] * probs).flatten())
        row_entropy = -(probs * probs.clamp_min(1e-300).log()).sum(1)
        return float(stationary @ row_entropy)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, index: int) -> Batch:
        window = self.tokens[index]
        return window[:-1], window[1:]


def _uniform_simplex(rows: int, size: int, gen: torch.Generator) -> torch.Tensor:
    """``rows`` draws from the flat Dirichlet(1, ..., 1): normalised exponential draws."""
    draws = -torch.rand(rows, size, generator=gen, dtype=torch.float64).log()
    return (draws / draws.sum(1, keepdim=True)).float()


class TokenFileDataset(Dataset[Batch]):
    """Non-overlapping windows of the token ids of a token file or a raw .bin: memory-mapped,
    or on an object store by ranged requests, a batch's windows concurrently
    (:meth:`__getitems__`, which the DataLoader calls). Each window's ids are checked against
    the vocabulary as they are read (:func:`~trainers.formats.token_file.check_ids`).

    The first ``1 - val_fraction`` of the windows are the ``train`` split, the rest ``val``.
    """

    def __init__(self, array: TokenArray, seq_len: int, split: str, val_fraction: float) -> None:
        self.array = array
        self.vocab_size = array.vocab_size
        self.tokens = array.open()
        self.seq_len = seq_len
        windows = (len(self.tokens) - 1) // seq_len
        n_val = max(1, math.ceil(windows * val_fraction))
        first, count = (0, windows - n_val) if split == "train" else (windows - n_val, n_val)
        self.first, self.count = first, max(count, 1)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> Batch:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> list[Batch]:
        starts = [(self.first + index) * self.seq_len for index in indices]
        spans = [slice(start, start + self.seq_len + 1) for start in starts]
        windows = (self.tokens.slices(spans) if isinstance(self.tokens, StoredIds)
                   else [self.tokens[span] for span in spans])
        batch = []
        for start, ids in zip(starts, windows, strict=True):
            check_ids(self.array, ids, start)
            window = torch.from_numpy(ids.astype(np.int64))
            batch.append((window[:-1], window[1:]))
        return batch


def shifted_sample(samples: Samples, index: int, seq_len: int) -> Batch:
    """Sample ``index`` cut to its first ``seq_len + 1`` tokens (the truncation rule of
    :mod:`trainers.formats.instruction_data`) as ``(inputs, targets)`` shifted by one, the
    targets :data:`~trainers.core.loss.IGNORE` where not in the loss."""
    start = int(samples.starts[index])
    end = min(int(samples.starts[index + 1]), start + seq_len + 1)
    ids = torch.from_numpy(samples.ids[start:end].astype(np.int64))
    counted = torch.from_numpy(samples.loss[start + 1:end])
    return ids[:-1], ids[1:].masked_fill(~counted, IGNORE)


class InstructionDataset(Dataset[Batch]):
    """Samples ``indices`` of ``samples``, one per item, cut to ``seq_len + 1`` tokens (the
    truncation rule of :mod:`trainers.formats.instruction_data`): inputs padded with id 0
    and targets with :data:`~trainers.core.loss.IGNORE` to ``seq_len``, the targets also
    IGNORE where the sample's tokens are not in the loss. :meth:`collate` cuts a batch to its
    longest sample, rounded up to a multiple of ``multiple`` (0: never cut, every batch
    ``seq_len`` wide, as a pipeline's fixed stage shapes need)."""

    def __init__(self, samples: Samples, indices: range, seq_len: int, multiple: int) -> None:
        self.samples, self.indices = samples, indices
        self.seq_len, self.multiple = seq_len, multiple
        self.lengths = np.minimum(samples.lengths()[indices.start:indices.stop] - 1, seq_len)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Batch:
        sample_inputs, sample_targets = shifted_sample(self.samples, self.indices[index],
                                                       self.seq_len)
        inputs = torch.zeros(self.seq_len, dtype=torch.long)
        targets = torch.full((self.seq_len,), IGNORE, dtype=torch.long)
        inputs[:len(sample_inputs)] = sample_inputs
        targets[:len(sample_targets)] = sample_targets
        return inputs, targets

    def collate(self, batch: list[Batch]) -> Batch:
        inputs, targets = (torch.stack(column) for column in zip(*batch, strict=True))
        if self.multiple:
            used = (targets != IGNORE).any(0).nonzero()
            width = int(used[-1]) + 1 if len(used) else 1
            width = min(self.seq_len, -(-width // self.multiple) * self.multiple)
            inputs, targets = inputs[:, :width], targets[:, :width]
        return inputs, targets


class PackedDataset(Dataset[Batch]):
    """Samples ``indices`` of ``samples``, each cut to ``seq_len + 1`` tokens, packed into
    sequences of ``seq_len`` by best-fit decreasing (longest sample first, each into the
    sequence it leaves least room in, a new one if none has room; a sample is never split).
    Items are ``(inputs, targets, positions)``: the positions restart at 0 where each sample
    starts, so the model attends within a sample
    (:func:`trainers.models.attention.document_mask`); the rest of a sequence is padding (id
    0, targets :data:`~trainers.core.loss.IGNORE`, positions of its own)."""

    def __init__(self, samples: Samples, indices: range, seq_len: int) -> None:
        self.samples, self.seq_len = samples, seq_len
        widths = np.minimum(samples.lengths()[indices.start:indices.stop] - 1, seq_len)
        self.packs: list[list[int]] = []
        room: list[tuple[int, int]] = []  # (positions left, pack), sorted
        for offset in np.argsort(-widths, kind="stable"):
            width = int(widths[offset])
            slot = bisect.bisect_left(room, (width, -1))
            if slot == len(room):
                self.packs.append([])
                left, pack = seq_len, len(self.packs) - 1
            else:
                left, pack = room.pop(slot)
            self.packs[pack].append(indices.start + int(offset))
            if left - width:
                bisect.insort(room, (left - width, pack))

    def __len__(self) -> int:
        return len(self.packs)

    def __getitem__(self, index: int) -> Batch:
        inputs = torch.zeros(self.seq_len, dtype=torch.long)
        targets = torch.full((self.seq_len,), IGNORE, dtype=torch.long)
        positions = torch.arange(self.seq_len)
        used = 0
        for sample in self.packs[index]:
            sample_inputs, sample_targets = shifted_sample(self.samples, sample, self.seq_len)
            span = slice(used, used + len(sample_inputs))
            inputs[span], targets[span] = sample_inputs, sample_targets
            positions[span] = torch.arange(len(sample_inputs))
            used += len(sample_inputs)
        positions[used:] = torch.arange(self.seq_len - used)
        return inputs, targets, positions


def instruction_datasets(cfg: TrainConfig, samples: Samples) -> tuple[Dataset[Batch],
                                                                      Dataset[Batch]]:
    """The last ``--val-fraction`` of the samples (at least one) for evaluation, the rest for
    training. Packed (:func:`~trainers.formats.instruction_data.packs`): :class:`PackedDataset`;
    padded: :class:`InstructionDataset`,
    batches cut to their longest sample except under a pipeline (``--pp`` > 1), and to a
    multiple of ``--tp`` under sequence parallelism."""
    n_val = max(1, math.ceil(len(samples) * cfg.val_fraction))
    split = len(samples) - n_val
    parts = range(0, split), range(split, len(samples))
    if packs(cfg):
        return tuple(PackedDataset(samples, part, cfg.seq_len) for part in parts)
    multiple = 0 if cfg.pp > 1 else (cfg.tp if cfg.sequence_parallel else 1)
    return tuple(InstructionDataset(samples, part, cfg.seq_len, multiple) for part in parts)


def build_datasets(cfg: TrainConfig, env: DistEnv) -> tuple[Dataset[Batch], Dataset[Batch]]:
    """The training and validation datasets that ``cfg.data`` names (a text source is
    tokenized first, see :func:`tokenized_text` and :func:`tokenized_samples`)."""
    vocab = model_vocab(cfg)
    if data_kind(cfg) == SYNTHETIC:
        return (MarkovChainDataset(vocab, cfg.seq_len, cfg.train_samples, cfg.seed),
                MarkovChainDataset(vocab, cfg.seq_len, cfg.val_samples, cfg.seed + 1))
    if data_kind(cfg) == TEXT and instruction_source(cfg) is not None:
        return instruction_datasets(cfg, tokenized_samples(cfg, env))
    array = tokenized_text(cfg, env) if data_kind(cfg) == TEXT else token_array(cfg)
    check_token_array(array, cfg.seq_len, vocab)
    return (TokenFileDataset(array, cfg.seq_len, "train", cfg.val_fraction),
            TokenFileDataset(array, cfg.seq_len, "val", cfg.val_fraction))


def tokenized_text(cfg: TrainConfig, env: DistEnv) -> TokenArray:
    """The cached token file of text ``--data``, written if it is missing while every other
    rank waits at a barrier: under a local ``--output-dir`` by local rank 0 of every node (on
    a shared file system racing nodes write the same bytes, and the last atomic rename wins),
    under a URL, which every node shares, by rank 0 alone (one upload; an object appears
    whole)."""
    files, tokenizer, cache = text_source(cfg)
    writer = env.rank == 0 if is_remote(cache) else env.local_rank == 0
    if writer and not cache.is_file():
        tokenize_corpus(files, cfg.text_field, tokenizer, cache, progress_line())
    if dist.is_initialized():
        dist.barrier()
    return read_header(cache)


def tokenized_samples(cfg: TrainConfig, env: DistEnv) -> Samples:
    """The cached samples of instruction ``--data``, written if missing as
    :func:`tokenized_text` writes a token file, less those whose whole completion ``--seq-len``
    cuts (:func:`~trainers.formats.instruction_data.kept_samples`: every rank reads the same
    cache and keeps the same samples)."""
    files, tokenizer, fmt, cache = instruction_source(cfg)
    writer = env.rank == 0 if is_remote(cache) else env.local_rank == 0
    if writer and not cache.is_file():
        write_samples(cache, tokenize_samples(files, fmt, cfg, tokenizer))
    if dist.is_initialized():
        dist.barrier()
    return kept_samples(read_samples(cache), cfg, str(cache))


def dataset_samples(dataset: Dataset[Batch]) -> Samples | None:
    """The instruction samples ``dataset`` draws from; None for windows of tokens."""
    return dataset.samples if isinstance(dataset, InstructionDataset | PackedDataset) else None

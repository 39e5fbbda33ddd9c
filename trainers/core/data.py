"""Training data: built-in learnable synthetic sequences and token ids (a token file, a raw
.bin, or a text corpus tokenized once into a cached token file), memory-mapped from a local
file or read from an object store one window per ranged request.

Both datasets hold fixed-length windows of ``seq_len + 1`` tokens and return ``(inputs,
targets)`` shifted by one. :class:`BatchStream` shards them over data-parallel ranks with a
:class:`~torch.utils.data.DistributedSampler` (reshuffled per epoch from the seed) and records
its position so that a resumed run continues with the next unseen micro-batch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from trainers.core.distributed import DistEnv
from trainers.torchfree.corpus import progress_line, tokenize_corpus
from trainers.torchfree.data_source import SYNTHETIC, TEXT, data_kind, text_source, token_array
from trainers.torchfree.errors import ConfigError
from trainers.torchfree.storage import is_remote
from trainers.torchfree.token_file import (
    StoredIds,
    TokenArray,
    check_ids,
    check_token_array,
    read_header,
)
from trainers.torchfree.train_config import TrainConfig, model_vocab

Batch = tuple[torch.Tensor, torch.Tensor]


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
    the vocabulary as they are read (:func:`~trainers.torchfree.token_file.check_ids`).

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


def build_datasets(cfg: TrainConfig, env: DistEnv) -> tuple[Dataset[Batch], Dataset[Batch]]:
    """The training and validation datasets that ``cfg.data`` names (a text source is
    tokenized first, see :func:`tokenized_text`)."""
    vocab = model_vocab(cfg)
    if data_kind(cfg) == SYNTHETIC:
        return (MarkovChainDataset(vocab, cfg.seq_len, cfg.train_samples, cfg.seed),
                MarkovChainDataset(vocab, cfg.seq_len, cfg.val_samples, cfg.seed + 1))
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


class _ResumableSampler(DistributedSampler):
    """A DistributedSampler that skips the first ``start`` indices of this rank's epoch."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(super().__iter__(), self.start, None)

    def __len__(self) -> int:
        return self.num_samples - self.start


class BatchStream:
    """Endless micro-batches of one data-parallel rank, epoch after epoch, with a position.

    ``state_dict()`` is ``{"epoch", "samples"}``: the epoch and the sequences all replicas
    consumed in it. Rank ``r`` of ``n`` reads the epoch's permutation at ``r, r+n, ...``, so
    the first ``k`` global batches are the same sequences at any data-parallel size; a stream
    built with that state, at this size or another that divides it, continues with exactly
    the sequences that would have come next.
    """

    def __init__(self, dataset: Dataset[Batch], micro_batch: int, dp_rank: int, dp_size: int,
                 seed: int, num_workers: int = 0, prefetch_factor: int = 2,
                 pin_memory: bool = False) -> None:
        self.sampler = _ResumableSampler(dataset, num_replicas=dp_size, rank=dp_rank,
                                         shuffle=True, seed=seed, drop_last=True)
        if self.sampler.num_samples < micro_batch:
            raise ConfigError(f"the dataset gives each of {dp_size} ranks fewer than "
                              f"{micro_batch} sequences; use more data or a smaller batch")
        # Its own generator: creating an iterator must not draw from the global RNG, whose
        # state (dropout) a checkpoint restores.
        self.loader = DataLoader(
            dataset, batch_size=micro_batch, sampler=self.sampler, drop_last=True,
            generator=torch.Generator().manual_seed(seed),
            num_workers=num_workers, pin_memory=pin_memory,
            prefetch_factor=prefetch_factor if num_workers else None,
            persistent_workers=num_workers > 0)
        self.dp_size = dp_size
        self.epoch = 0
        self.offset = 0  # sequences this rank consumed in the epoch
        self._iter: Iterator[Batch] | None = None

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "samples": self.offset * self.dp_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        samples = int(state["samples"])
        if samples % self.dp_size:
            raise ConfigError(f"the checkpoint's data position ({samples} sequences) does not "
                              f"divide over {self.dp_size} replicas; resume at a data-parallel "
                              "size that divides the global batch")
        self.epoch, self.offset = int(state["epoch"]), samples // self.dp_size
        self._iter = None

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Batch:
        while True:
            if self._iter is None:
                self.sampler.set_epoch(self.epoch)
                self.sampler.start = self.offset
                self._iter = iter(self.loader)
            batch = _next_batch(self._iter)
            if batch is not None:
                self.offset += len(batch[0])
                return batch
            self.epoch, self.offset, self._iter = self.epoch + 1, 0, None


def _next_batch(batches: Iterator[Batch]) -> Batch | None:
    """The next batch, or None; a ConfigError raised in a DataLoader worker (which the loader
    re-raises with the worker's traceback in its message) is raised again with its one line."""
    try:
        return next(batches, None)
    except ConfigError as err:
        lines = str(err).rstrip().splitlines()
        if len(lines) == 1:
            raise
        raise type(err)(lines[-1].split(": ", 1)[-1]) from None


def eval_batches(dataset: Dataset[Batch], micro_batch: int, dp_rank: int, dp_size: int,
                 count: int) -> list[Batch]:
    """The first ``count`` micro-batches of this rank's unshuffled share of ``dataset`` (the
    last one may be short)."""
    sampler = DistributedSampler(dataset, num_replicas=dp_size, rank=dp_rank, shuffle=False,
                                 drop_last=True)
    if sampler.num_samples == 0:
        raise ConfigError(f"the validation set ({len(dataset)} sequences) leaves some of "
                          f"{dp_size} ranks none; raise --val-fraction or use more data")
    loader = DataLoader(dataset, batch_size=micro_batch, sampler=sampler)
    batches = list(itertools.islice(loader, count))
    return batches

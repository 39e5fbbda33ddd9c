"""How a rank draws its batches: :class:`BatchStream` shards a dataset of
:mod:`trainers.core.data` over the data-parallel ranks with a
:class:`~torch.utils.data.DistributedSampler` (reshuffled per epoch from the seed; instruction
samples in length buckets, :func:`length_buckets`) and records its position, so that a resumed
run continues with the next unseen micro-batch; :func:`eval_batches` is a rank's fixed share
of the validation set.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from trainers.core.data import Batch, InstructionDataset
from trainers.errors import ConfigError

BUCKET_BATCHES = 16  # global batches whose samples are sorted by length together


def length_buckets(lengths: np.ndarray, group: int, generator: torch.Generator) -> list[int]:
    """A shuffled order of ``len(lengths)`` samples in which every ``group`` consecutive ones
    (a global batch) have similar lengths: the shuffled samples are sorted by length in
    windows of :data:`BUCKET_BATCHES` groups and cut into groups, and the full groups are
    shuffled (a last, shorter one stays last). The order does not depend on how the groups
    are split over ranks."""
    order = torch.randperm(len(lengths), generator=generator)
    sizes = torch.as_tensor(lengths)
    groups: list[torch.Tensor] = []
    for window in order.split(group * BUCKET_BATCHES):
        groups += window[sizes[window].argsort(stable=True)].split(group)
    full = [g for g in groups if len(g) == group]
    shuffled = [full[i] for i in torch.randperm(len(full), generator=generator)]
    return torch.cat(shuffled + [g for g in groups if len(g) < group]).tolist()


class _ResumableSampler(DistributedSampler):
    """A DistributedSampler that skips the first ``start`` indices of this rank's epoch; with
    ``lengths``, its epoch's order is :func:`length_buckets` of global batches of ``group``."""

    def __init__(self, *args, lengths: np.ndarray | None = None, group: int = 0,
                 **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.start = 0
        self.lengths, self.group = lengths, group

    def __iter__(self) -> Iterator[int]:
        if self.lengths is None:
            return itertools.islice(super().__iter__(), self.start, None)
        order = length_buckets(self.lengths, self.group,
                               torch.Generator().manual_seed(self.seed + self.epoch))
        mine = order[:self.total_size][self.rank:self.total_size:self.num_replicas]
        return itertools.islice(mine, self.start, None)

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
                 pin_memory: bool = False, global_batch: int = 0) -> None:
        instructions = isinstance(dataset, InstructionDataset)
        self.sampler = _ResumableSampler(
            dataset, num_replicas=dp_size, rank=dp_rank, shuffle=True, seed=seed,
            drop_last=True, lengths=dataset.lengths if instructions else None,
            group=global_batch or micro_batch * dp_size)
        if self.sampler.num_samples < micro_batch:
            raise ConfigError(f"the dataset gives each of {dp_size} ranks fewer than "
                              f"{micro_batch} sequences; use more data or a smaller batch")
        # Its own generator: creating an iterator must not draw from the global RNG, whose
        # state (dropout) a checkpoint restores.
        self.loader = DataLoader(
            dataset, batch_size=micro_batch, sampler=self.sampler, drop_last=True,
            collate_fn=dataset.collate if instructions else None,
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
    loader = DataLoader(dataset, batch_size=micro_batch, sampler=sampler,
                        collate_fn=dataset.collate if isinstance(dataset, InstructionDataset)
                        else None)
    batches = list(itertools.islice(loader, count))
    return batches

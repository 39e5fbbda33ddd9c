"""Data: deterministic, learnable, sharded without overlap, resumable; token files."""

from __future__ import annotations

import math

import numpy as np
import torch

from tests.support.processes import run_forked
from trainers.core.batch_stream import BatchStream, eval_batches
from trainers.core.data import MarkovChainDataset, TokenFileDataset
from trainers.formats.token_file import read_header


def test_synthetic_data_is_deterministic_and_seed_dependent():
    a = MarkovChainDataset(256, 32, 64, seed=1)
    b = MarkovChainDataset(256, 32, 64, seed=1)
    c = MarkovChainDataset(256, 32, 64, seed=2)
    assert torch.equal(a.tokens, b.tokens)
    assert not torch.equal(a.tokens, c.tokens)
    inputs, targets = a[3]
    assert torch.equal(inputs[1:], targets[:-1])


def test_synthetic_data_is_learnable_far_below_chance():
    data = MarkovChainDataset(256, 32, 16, seed=1)
    assert data.entropy_rate() < math.log(4) < math.log(256) / 3


def _epoch(dataset, rank, world, micro=4):
    stream = BatchStream(dataset, micro, rank, world, seed=7)
    per_epoch = len(dataset) // world // micro
    return [tuple(row.tolist()) for _ in range(per_epoch) for row in next(stream)[0]]


def test_ranks_see_disjoint_shards_that_cover_the_epoch():
    data = MarkovChainDataset(256, 16, 64, seed=3)
    shards = [_epoch(data, rank, 2) for rank in range(2)]
    assert not set(shards[0]) & set(shards[1])
    assert len(set(shards[0]) | set(shards[1])) == len({tuple(r.tolist()) for r in
                                                         data.tokens[:, :-1]})


def test_epochs_reshuffle_deterministically():
    data = MarkovChainDataset(256, 16, 32, seed=3)
    stream = BatchStream(data, 4, 0, 1, seed=7)
    first = [next(stream)[0] for _ in range(8)]
    second = [next(stream)[0] for _ in range(8)]
    assert stream.state_dict() == {"epoch": 1, "samples": 32}
    assert not all(torch.equal(x, y) for x, y in zip(first, second, strict=True))
    again = BatchStream(data, 4, 0, 1, seed=7)
    assert all(torch.equal(x, next(again)[0]) for x in first)


def test_a_resumed_stream_continues_with_the_next_batch():
    data = MarkovChainDataset(256, 16, 32, seed=3)
    full = BatchStream(data, 4, 1, 2, seed=7)
    expected = [next(full)[0] for _ in range(10)]  # crosses an epoch boundary (4 per epoch)
    partial = BatchStream(data, 4, 1, 2, seed=7)
    for _ in range(5):
        next(partial)
    resumed = BatchStream(data, 4, 1, 2, seed=7)
    resumed.load_state_dict(partial.state_dict())
    assert all(torch.equal(x, next(resumed)[0]) for x in expected[5:])


def test_a_stream_resumes_at_another_data_parallel_size():
    """Two replicas' first k global batches are one replica's first k batches, and on."""
    data = MarkovChainDataset(256, 16, 32, seed=3)
    two = [BatchStream(data, 2, rank, 2, seed=7) for rank in range(2)]
    for _ in range(3):  # three global batches of 4
        for stream in two:
            next(stream)
    one = BatchStream(data, 4, 0, 1, seed=7)
    one.load_state_dict(two[0].state_dict())
    reference = BatchStream(data, 4, 0, 1, seed=7)
    for _ in range(3):
        next(reference)
    for _ in range(6):  # into the next epoch
        assert torch.equal(next(one)[0], next(reference)[0])


def test_eval_batches_are_fixed_and_sharded():
    data = MarkovChainDataset(256, 16, 20, seed=5)
    rank0, rank1 = (eval_batches(data, 4, r, 2, count=10) for r in range(2))
    assert [len(b[0]) for b in rank0] == [4, 4, 2]
    assert not torch.equal(rank0[0][0], rank1[0][0])


def test_tokenize_script_round_trips_bytes(tmp_path):
    text = "hello, wörld\n" * 200
    source, target = tmp_path / "in.txt", tmp_path / "out.bin"
    source.write_text(text, encoding="utf-8")
    out = run_forked("trainers.tools.prepare_data", [str(source), str(target)])
    assert f"wrote {len(text.encode()):,} tokens" in out.stdout
    train = TokenFileDataset(read_header(target), 32, "train", 0.1)
    val = TokenFileDataset(read_header(target), 32, "val", 0.1)
    windows = (len(text.encode()) - 1) // 32
    assert len(train) + len(val) == windows and len(val) == math.ceil(windows * 0.1)
    inputs, targets = train[0]
    assert bytes(inputs.tolist()) == text.encode()[:32]
    assert torch.equal(inputs[1:], targets[:-1])
    first_val, _ = val[0]
    start = len(train) * 32
    assert bytes(first_val.tolist()) == text.encode()[start:start + 32]
    assert np.asarray(train.tokens).dtype == np.uint16


def test_tokenize_rejects_empty_input(tmp_path):
    source = tmp_path / "empty.txt"
    source.write_text("")
    proc = run_forked("trainers.tools.prepare_data", [str(source), str(tmp_path / "o.bin")],
                      check=False)
    assert proc.returncode == 2 and "is empty" in proc.stderr

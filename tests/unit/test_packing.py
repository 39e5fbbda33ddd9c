"""Packed samples: a packed batch's loss equals the token-weighted mean of its samples run one
by one (fp32), for the GPT and Llama families and a Hugging Face model, because attention and
positions restart at each sample; and the packing rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainers.core.data import PackedDataset
from trainers.core.loss import IGNORE, cross_entropy
from trainers.formats.instruction_data import Samples
from trainers.models import build_model
from trainers.models.huggingface import tiny_llama_config

SEQ = 48


def samples(lengths: list[int], vocab: int) -> Samples:
    """Random ids; the first third of each sample (its prompt) out of the loss."""
    gen = np.random.default_rng(0)
    ids = [gen.integers(1, vocab, size=n) for n in lengths]
    loss = [np.arange(n) >= n // 3 for n in lengths]
    return Samples(np.concatenate(ids), np.concatenate(loss),
                   np.concatenate([[0], np.cumsum(lengths)]), vocab)


def test_samples_pack_best_fit_decreasing_without_splitting():
    packed = PackedDataset(samples([10, 20, 19, 30, 60], 256), range(5), SEQ)
    # 60 is cut to 48 positions and fills a sequence; 29 + 19 fill the next exactly; 18 + 9.
    assert packed.packs == [[4], [3, 1], [2, 0]]
    assert packed[0][2].tolist() == list(range(SEQ))
    assert packed[1][2].tolist() == [*range(29), *range(19)]
    inputs, targets, positions = packed[2]
    assert positions.tolist() == [*range(18), *range(9), *range(21)]
    assert targets[27:].eq(IGNORE).all() and inputs[27:].eq(0).all()
    assert not targets[:27].eq(IGNORE).all()


@pytest.mark.parametrize("model", ["tiny", "llama-tiny", "hf"])
def test_a_packed_batch_has_the_loss_of_its_samples_one_by_one(tmp_path, model):
    if model == "hf":
        tiny_llama_config(tmp_path)
        model = f"hf:{tmp_path}"
    torch.manual_seed(0)
    net = build_model(model).eval()
    vocab = net(torch.zeros(1, 1, dtype=torch.long)).shape[-1]
    data = samples([7, 12, 16, 9, 30], vocab)
    packed = PackedDataset(data, range(5), SEQ)
    assert packed.packs == [[4, 2], [1, 3, 0]]
    inputs, targets, positions = (torch.stack(t) for t in zip(*(packed[i] for i in range(2)),
                                                               strict=True))
    with torch.no_grad():
        packed_loss = cross_entropy(net(inputs, positions), targets)
        sums, counted = torch.zeros(()), 0
        for index in range(len(data)):
            start, end = data.starts[index], data.starts[index + 1]
            ids = torch.from_numpy(data.ids[start:end]).long()
            alone = ids[1:].masked_fill(~torch.from_numpy(data.loss[start + 1:end]), IGNORE)
            n = int((alone != IGNORE).sum())
            sums += cross_entropy(net(ids[None, :-1]), alone[None]) * n
            counted += n
    torch.testing.assert_close(packed_loss, sums / counted, rtol=1e-5, atol=1e-6)
    # Attention across samples would change it: the same batch without positions differs.
    with torch.no_grad():
        assert not torch.allclose(cross_entropy(net(inputs), targets), packed_loss, rtol=1e-4)

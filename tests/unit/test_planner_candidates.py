"""Every configuration the planner can recommend is one its trainer serves: the flags it
prints parse and validate with that trainer's own parser at the job's world size, its TP
inside a node and its PP across whole nodes; 3-D layouts are among them."""

from __future__ import annotations

import itertools

import pytest

from trainers.config.parsing import parse_config
from trainers.planning.planner import candidates
from trainers.sizing.shapes import MODEL_SIZES

# (devices per node, nodes): one GPU, one node, and several nodes of 2, 4 and 8.
CLUSTERS = [(1, 1), (8, 1), (2, 2), (4, 2), (8, 4)]


@pytest.mark.parametrize("model", sorted(MODEL_SIZES))
def test_every_candidate_is_accepted_by_its_trainers_parser(model):
    shape = MODEL_SIZES[model]
    seq = min(256, shape.max_seq_len)
    seen = set()
    for (per_node, nodes), batch in itertools.product(CLUSTERS, (32, 64)):
        world = per_node * nodes
        for candidate in candidates(shape, seq, batch, per_node, nodes, "bf16", "cuda"):
            argv = ["--model", model, "--batch-size", str(batch), "--seq-len", str(seq),
                    *candidate.flags().split()]
            try:
                parse_config(argv, candidate.trainer, [world], check_paths=False)
            except Exception as err:
                pytest.fail(f"{candidate.describe()} at {nodes}x{per_node}: trainers."
                            f"{candidate.trainer} {' '.join(argv)} is refused: {err}")
            # TP inside a node, PP across nodes (whole nodes per stage).
            assert per_node % candidate.layout.tp == 0, candidate.describe()
            assert nodes % candidate.layout.pp == 0, candidate.describe()
            seen.add((candidate.trainer, candidate.layout.tp > 1, candidate.layout.pp > 1,
                      candidate.layout.dp > 1 and candidate.layout.sharding))
    assert {trainer for trainer, *_ in seen} >= {"ddp", "fsdp", "tensor_parallel"}
    if shape.pipeline and shape.n_layers % 2 == 0:  # 3-D: pipeline x TP x FSDP (ZeRO-2, -3)
        assert {("pipeline", True, True, s) for s in ("zero2", "zero3")} <= seen

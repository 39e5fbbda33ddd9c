"""Naive model-parallel trainer: ``python -m trainers.model_parallel --devices cuda:0,cuda:1``.

One process spreads the blocks over a list of devices in contiguous groups (the embeddings
and the tied head on the first device, the final norm with the last block) and moves the
activations across each boundary explicitly in forward; autograd carries the gradients back
through the same copies. Only one device works at a time: this is the baseline that pipeline
parallelism improves on. Under torchrun each process holds such a model and DDP averages the
gradients across processes (one process per node, each with its own devices).
"""

from __future__ import annotations

from collections.abc import Sequence

from trainers.core.distributed import DistEnv
from trainers.core.entry import run
from trainers.core.strategy import Strategy
from trainers.models import ModelSpec, materialize
from trainers.options.train_config import TrainConfig
from trainers.parallel.compile import apply_block_options
from trainers.parallel.ddp import DDPStrategy
from trainers.parallel.spread import parse_devices, spread_over


def build(cfg: TrainConfig, env: DistEnv, spec: ModelSpec) -> Strategy:
    """The blocks spread over ``--devices`` in this process; DDP across processes."""
    model = spec.meta_model()
    apply_block_options(model, spec, cfg)
    spread_over(model, spec, parse_devices(cfg.devices))
    materialize(model, None, cfg.seed, spec)
    return DDPStrategy(model, env)


def main(argv: Sequence[str] | None = None) -> None:
    run("model_parallel", build, argv)


if __name__ == "__main__":
    main()

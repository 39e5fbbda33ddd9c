"""The training core: model, attention, data, the one loop, checkpoints, metrics, process group.

It knows nothing of any one parallelism: strategies (:mod:`trainers.parallel`) plug into the
loop through :class:`trainers.core.strategy.Strategy`.
"""

"""The training core: data, the one loop, checkpoints, metrics, process group; it builds models
from :mod:`trainers.models`.

It knows nothing of any one parallelism: strategies (:mod:`trainers.parallel`) plug into the
loop through :class:`trainers.core.strategy.Strategy`.
"""

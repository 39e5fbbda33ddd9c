"""Parallelism applied to the plain model by small functions, and the runtime strategies.

Order matters and is the one torchtitan uses: tensor parallelism first (it addresses modules by
their names), then activation checkpointing (it wraps whole blocks), then FSDP (it shards
whatever parameters it finds, DTensors from tensor parallelism included). Each applies to a
model still on the meta device; :func:`trainers.models.materialize` then allocates
and fills what the rank holds.
"""

"""Distributed PyTorch trainers: one entry module per trainer (``python -m trainers.<name>``)
over three layers: ``spec`` (torch-free config, table of trainers, planner), ``core`` (model,
data, the one loop, checkpoints, metrics) and ``parallel`` (parallelism and strategies).
See docs/architecture.md.
"""

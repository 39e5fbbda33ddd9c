"""The torch-free layer: what the TorchX components import to check a job before submitting it.

Config and its parser, the table of trainers, model shapes, memory formulas and the planner,
fault points, the checkpoint and token file formats, errors. Nothing here imports torch
(tests/integration/test_layers.py holds it to that).
"""

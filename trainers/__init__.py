"""Distributed PyTorch trainers on one shared core.

The core: config, model, data, loop, checkpoint, metrics; one entry point per strategy.
"""

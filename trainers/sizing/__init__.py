"""Sizing a job without running it: model shapes, what a node offers, the memory anatomy of a
step, the scaling projection and a step's breakdown. Imports no torch."""

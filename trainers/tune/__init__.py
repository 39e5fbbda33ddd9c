"""Hyperparameter search on Ray Tune: the search space and the search."""

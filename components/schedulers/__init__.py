"""TorchX schedulers extended through TorchX's own plugin point (``torchx.schedulers`` entry
points in pyproject.toml): each subclasses a built-in scheduler, adds the run options users
need, and rejects bad options with :class:`components.launch.ComponentArgumentError` (one line,
no traceback, nothing submitted)."""

"""TorchX schedulers extended through TorchX's own plugin point (``torchx.schedulers`` entry
points in pyproject.toml): each subclasses a built-in scheduler, adds the run options users
need, and rejects bad options with :class:`components.errors.ComponentArgumentError` (one line
that starts with the scheduler's name, no traceback, nothing submitted). One package per
family: ``local/`` (local_cwd, local_docker), ``slurm/``, ``k8s/`` (kubernetes,
kubernetes_jobset); ``run_options`` reads every scheduler's run options strictly;
``torchx_workarounds/`` holds every place that bridges what TorchX lacks (its private names, the
differences between its releases, its other built-in schedulers kept in its table)."""

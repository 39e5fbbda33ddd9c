"""Distributed PyTorch trainers: the five trainers' entry modules (``python -m trainers.<name>``)
over packages named for what they hold: the torch-free ``errors``, ``runs``, ``sizing``,
``options``, ``formats``, ``config`` and ``planning`` (what a component imports to check a job
before submitting it), then ``models``, ``core`` (the one loop) and ``parallel``; the commands
in ``tools``, ``on_ray``, ``scaling`` and ``tune``. pyproject.toml's import contracts hold the
layers; see docs/architecture.md.
"""

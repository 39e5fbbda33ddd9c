"""The schedulers that run a job on this machine: ``local_cwd`` (processes in the current
directory, :mod:`.cwd`) and ``local_docker`` (containers of a Docker Engine API, Docker or
podman, :mod:`.docker_engine`). What they need of TorchX's private names is in
:mod:`components.schedulers.torchx_workarounds.local` and ``.local_docker``."""

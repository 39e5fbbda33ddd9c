"""The schedulers that run a job on this machine: ``local_cwd`` (processes in the current
directory, :mod:`.cwd`) and ``local_docker`` (containers of a Docker Engine API, Docker or
podman, :mod:`.docker_engine`); :mod:`.torchx_private` is the only module that uses TorchX's
private names."""

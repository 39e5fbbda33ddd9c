"""The schedulers that run a job on this machine: ``local_cwd`` (processes in the current
directory, :mod:`.cwd`) and ``local_docker`` (containers of a Docker Engine API, Docker or
podman, :mod:`.docker_engine`); :mod:`.torchx_private` and :mod:`.torchx_private_docker` are
the only modules that use TorchX's private names (one a scheduler, so that ``local_cwd`` does not
import TorchX's Docker scheduler)."""

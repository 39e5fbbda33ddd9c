"""TorchX's built-in schedulers that this repository does not extend, kept in TorchX's table.

In torchx 0.7.0, registering any ``torchx.schedulers`` entry point replaces TorchX's table of
built-in schedulers, so pyproject.toml registers each of them again by the name TorchX gives
it, pointing here. Each factory imports TorchX's own module for the name when it is used; on
a TorchX that no longer has it (TorchX main dropped these) it raises ModuleNotFoundError in one
line, which ``torchx runopts`` shows beside the name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

# name -> TorchX 0.7.0's module (torchx.schedulers.DEFAULT_SCHEDULER_MODULES, less the four
# this repository registers itself: local_cwd, local_docker, slurm and kubernetes).
MODULES = {
    "kubernetes_mcad": "torchx.schedulers.kubernetes_mcad_scheduler",
    "aws_batch": "torchx.schedulers.aws_batch_scheduler",
    "aws_sagemaker": "torchx.schedulers.aws_sagemaker_scheduler",
    "gcp_batch": "torchx.schedulers.gcp_batch_scheduler",
    "ray": "torchx.schedulers.ray_scheduler",
    "lsf": "torchx.schedulers.lsf_scheduler",
}


def _factory(name: str) -> Callable[..., Any]:
    def create_scheduler(session_name: str, **kwargs: Any) -> Any:
        """TorchX's ``create_scheduler`` for this built-in scheduler."""
        try:
            module = importlib.import_module(MODULES[name])
        except ModuleNotFoundError as err:
            if err.name != MODULES[name]:
                raise  # the scheduler's own dependency (e.g. boto3): pip says which
            import torchx

            raise ModuleNotFoundError(
                f"scheduler {name} is not in torchx {torchx.__version__} (TorchX after 0.7.0 "
                "dropped it); use torchx==0.7.0 for it", name=MODULES[name]) from None
        return module.create_scheduler(session_name, **kwargs)

    create_scheduler.__name__ = name
    return create_scheduler


kubernetes_mcad = _factory("kubernetes_mcad")
aws_batch = _factory("aws_batch")
aws_sagemaker = _factory("aws_sagemaker")
gcp_batch = _factory("gcp_batch")
ray = _factory("ray")
lsf = _factory("lsf")

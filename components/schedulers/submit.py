"""The check every scheduler of this repository makes when it submits a job, and never for a dry
run: the object stores the job's trainer names are reachable with this environment's
credentials, the buckets exist and ``--output-dir`` can be written.

A component (:func:`components.launch.trainer_app`) notes the trainer's locations in the role's
metadata (:func:`note_stores`) when one of them is a URL (``--output-dir``, ``--data``,
``--tokenizer``, ``--resume``, an ``hf:s3://`` ``--model``) and ``--check_paths`` is on (off:
only the job's nodes can reach the store); it checks only their schemes itself, so ``torchx run
--dryrun`` renders without the bucket. :class:`SubmitChecks` is a base of every scheduler class
registered in pyproject.toml; its ``schedule`` is where TorchX's Python runner
(``Runner.schedule``, so ``torchx run`` and ``Runner.run_component``) and ``Scheduler.submit``
hand a dry-run result over to be submitted. It runs
:func:`trainers.torchfree.config_checks.check_stores` first and refuses with one line
(:class:`~components.errors.ComponentArgumentError`, naming the scheduler and the fix) before
anything is submitted; then :meth:`SubmitChecks.schedule_checked`, which the scheduler classes
override instead of ``schedule``, submits.

TorchX keeps the AppDef of a dry-run result in ``AppDryRunInfo`` (set by
``Scheduler.submit_dryrun``): the private ``_app`` in torchx 0.7.0, the public ``app`` on
TorchX main (where ``Runner.schedule`` reads it too); :func:`dryrun_app` is the one place that
reads it.
"""

from __future__ import annotations

from typing import Any

from torchx.schedulers.api import AppDryRunInfo
from torchx.specs import AppDef, Role

from components.errors import ComponentArgumentError
from trainers.torchfree.config_checks import check_stores
from trainers.torchfree.errors import ConfigError
from trainers.torchfree.model_names import in_store
from trainers.torchfree.storage import is_url
from trainers.torchfree.train_config import TrainConfig

# Role metadata key: the trainer's locations ({field: value}) when one of them is a URL.
STORES = "torchx_templates/stores"
# The TrainConfig fields that name a location the run reads or writes (the model: hf:DIR).
LOCATIONS = ("output_dir", "data", "tokenizer", "resume", "model")


def note_stores(role: Role, cfg: TrainConfig) -> None:
    """Note ``cfg``'s locations in ``role``'s metadata when one of them is on an object store
    (an ``hf:s3://`` model too), for :class:`SubmitChecks` to check at submit."""
    fields = {name: getattr(cfg, name) for name in LOCATIONS}
    if any(is_url(fields[name]) for name in LOCATIONS[:-1]) or in_store(cfg.model):
        role.metadata[STORES] = fields


def dryrun_app(dryrun_info: AppDryRunInfo[Any]) -> AppDef | None:
    """The AppDef a dry-run result was made of (None for one not made by ``submit_dryrun``):
    ``app`` on TorchX main, ``_app`` in torchx 0.7.0."""
    return getattr(dryrun_info, "app", None) or getattr(dryrun_info, "_app", None)


def check_app_stores(scheduler: str, app: AppDef | None) -> None:
    """ComponentArgumentError (one line starting with ``scheduler``) when an object store that a
    role of ``app`` noted (:func:`note_stores`) cannot be reached, read or written."""
    for role in app.roles if app is not None else []:
        fields = role.metadata.get(STORES)
        if fields:
            try:
                check_stores(TrainConfig(**fields))
            except ConfigError as err:
                raise ComponentArgumentError(
                    f"{scheduler}: {err}; nothing was submitted (if only the job's nodes can "
                    "reach the store, pass --check_paths False)") from None


class SubmitChecks:
    """Mixin of a TorchX scheduler class (before TorchX's class among its bases): ``schedule``
    checks the job's object stores, then calls :meth:`schedule_checked`, which subclasses
    override to submit. ``registered_as`` names the scheduler in the error."""

    registered_as: str

    def schedule(self, dryrun_info: AppDryRunInfo[Any]) -> str:
        check_app_stores(self.registered_as, dryrun_app(dryrun_info))
        return self.schedule_checked(dryrun_info)

    def schedule_checked(self, dryrun_info: AppDryRunInfo[Any]) -> str:
        """Submit ``dryrun_info`` (TorchX's ``schedule``), its stores checked."""
        return super().schedule(dryrun_info)  # type: ignore[misc]

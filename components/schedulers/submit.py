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
:func:`trainers.config.checks.check_stores` first and refuses with one line
(:class:`~components.errors.ComponentArgumentError`, naming the scheduler and the fix) before
anything is submitted; then :meth:`SubmitChecks.schedule_checked`, which the scheduler classes
override instead of ``schedule``, submits.

The AppDef of a dry-run result is read by
:func:`components.schedulers.torchx_workarounds.releases.dryrun_app`.
"""

from __future__ import annotations

from typing import Any

from torchx.schedulers.api import AppDryRunInfo
from torchx.specs import AppDef, Role

from components.errors import ComponentArgumentError
from components.schedulers.torchx_workarounds.releases import dryrun_app
from trainers.config.checks import check_stores
from trainers.errors import ConfigError
from trainers.options.model_names import in_store
from trainers.options.train_config import TrainConfig
from trainers.runs.storage import is_url

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

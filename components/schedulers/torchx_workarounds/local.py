"""The names of TorchX's ``LocalScheduler`` that ``local_cwd`` uses and TorchX keeps private.

TorchX's local scheduler has no public hook for what :mod:`.cwd` extends: ``local_cwd`` records
the process groups of a job it started, so that ``torchx status`` and ``torchx cancel`` from
another process find it, and TorchX's ``LocalScheduler`` keeps a job's processes only in
``_apps`` (app id -> ``_LocalAppDef``, whose ``role_replicas`` hold each replica's ``proc``).
:mod:`.local_docker` does the same for ``local_docker``; the two are apart so that
``local_cwd`` (``torchx run``'s default) does not import TorchX's Docker scheduler and the
``docker`` client.

These names have these meanings in torchx 0.7.0 and on TorchX main (torchx-nightly
2026.10.26). The class here gives them public names; the other modules of the package override
only the methods TorchX's Scheduler API defines for implementers (``schedule``, through
:class:`~components.schedulers.submit.SubmitChecks`, ``describe``, ``_validate``,
``_cancel_existing``) and public ones.
"""

from __future__ import annotations

from torchx.schedulers.local_scheduler import LocalScheduler


class TorchXLocalScheduler(LocalScheduler):
    """TorchX's ``LocalScheduler`` with public names for the jobs this object started."""

    def started_here(self, app_id: str) -> bool:
        """Whether this scheduler object started ``app_id`` (and still holds its processes)."""
        return app_id in self._apps

    def process_groups(self, app_id: str) -> list[int]:
        """The process group ids of ``app_id``'s replicas (one a replica: torchrun and its
        workers), of a job :meth:`started_here`."""
        return [replica.proc.pid for replicas in self._apps[app_id].role_replicas.values()
                for replica in replicas]

"""The one module of :mod:`components.schedulers.k8s` that uses TorchX's private names.

Both Kubernetes schedulers talk to the API server through the client that TorchX's
``KubernetesScheduler`` builds from the kube config (``create_scheduler(client=...)`` replaces
it), so that ``kubernetes_jobset`` reaches the cluster exactly as ``kubernetes`` does (TorchX
main, unlike 0.7.0, tries the in-cluster config first). TorchX has no public accessor for that
client: it keeps ``_api_client()`` (the ``ApiClient``), ``_custom_objects_api()`` (a
``CustomObjectsApi`` on it) and ``_get_active_context()`` (the kube config's current context)
private, with these names and meanings in torchx 0.7.0 and on TorchX main (torchx-nightly
2026.10.26). :class:`TorchXKubernetesScheduler` gives them public names; the other modules
of the package override only the methods TorchX's Scheduler API defines for implementers
(``_submit_dryrun``, ``_run_opts``, ``_cancel_existing``, ``schedule`` (through
:class:`~components.schedulers.submit.SubmitChecks`), ``describe``,
``log_iter``, ``list``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchx.schedulers.kubernetes_scheduler import KubernetesScheduler

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, CustomObjectsApi


class TorchXKubernetesScheduler(KubernetesScheduler):
    """TorchX's ``KubernetesScheduler`` with public names for its API client."""

    def api_client(self) -> ApiClient:
        """TorchX's client of the API server (built from the kube config on first use)."""
        return self._api_client()

    def custom_objects_api(self) -> CustomObjectsApi:
        """A ``CustomObjectsApi`` on :meth:`api_client`."""
        return self._custom_objects_api()

    def context_namespace(self) -> str:
        """The namespace of the kube config's current context ("default" when it names none)."""
        return self._get_active_context()["context"].get("namespace") or "default"

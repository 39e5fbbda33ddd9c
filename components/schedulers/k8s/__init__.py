"""The Kubernetes schedulers: ``kubernetes`` (a Volcano Job, :mod:`.volcano`) and
``kubernetes_jobset`` (a JobSet admitted by Kueue, :mod:`.jobset`, its states in :mod:`.states`),
with the same hardened pods. Both derive from :mod:`.base` (pod run options, workspace error,
the API server's dry run); :mod:`.options` parses the run options, :mod:`.pod` builds each pod
(and sizes its /dev/shm), :mod:`.preemption` decides the grace period and the restarts. What
they need of TorchX's private names is in :mod:`components.schedulers.torchx_workarounds.k8s`."""

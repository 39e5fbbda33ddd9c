"""The trainers under Ray Train: options and launch, the cluster, each worker."""

"""A run on disk or an object store: where it reads and writes (fsspec), its checkpoints' files
and manifest, its recorded config, its mirrored outputs and figure, its logging, fault points and
preemption signals. Imports no torch."""

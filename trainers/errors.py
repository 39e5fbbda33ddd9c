"""The error every layer raises for input that cannot work."""


class ConfigError(ValueError):
    """A bad argument or input; the message is one line that says what to change."""


class CheckpointWriteError(ConfigError):
    """A checkpoint could not be written (e.g. the disk is full); the message is one line that
    names the checkpoint that survives and what to change."""


class MissingPathError(ConfigError):
    """A path named by an option does not exist on this machine (where a job is submitted from,
    it may still exist where the job runs)."""

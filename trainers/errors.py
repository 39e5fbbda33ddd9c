"""The error every layer raises for input that cannot work."""


class ConfigError(ValueError):
    """A bad argument or input; the message is one line that says what to change."""

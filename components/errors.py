"""The error components and schedulers raise for an argument that cannot work."""

from torchx.specs.finder import ComponentValidationException


class ComponentArgumentError(ComponentValidationException, ValueError):
    """A component or scheduler argument that cannot work; the message is one line naming the
    fix.

    ``torchx run`` reports a ComponentValidationException as an error without a traceback
    and exits 1 before scheduling anything.
    """

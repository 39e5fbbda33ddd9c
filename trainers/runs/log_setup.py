"""How the trainers' processes log: INFO lines ``LEVEL name: message``, with the chatty
INFO of the object-store clients (one line per credential lookup) held to warnings."""

from __future__ import annotations

import logging

# Clients that log routine INFO (found credentials, found an endpoint) on every connection.
QUIET = ("botocore", "aiobotocore", "s3fs", "fsspec", "urllib3")


def configure_logging() -> None:
    """Log INFO and above to stderr; the object-store clients warnings and above."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)

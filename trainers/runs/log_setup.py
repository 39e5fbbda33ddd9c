"""How the trainers' processes log: INFO lines ``LEVEL name: message``, with the chatty
INFO of the object-store clients (one line per credential lookup) and of torchft (lines on
every step's quorum and commit) held to warnings."""

from __future__ import annotations

import logging
import os

# Loggers of routine INFO: object-store clients on every connection, torchft on every step.
QUIET = ("botocore", "aiobotocore", "s3fs", "fsspec", "urllib3", "torchft", "torchft_commits",
         "torchft_quorums", "torchft_errors")


def configure_logging() -> None:
    """Log INFO and above to stderr; the object-store clients and torchft warnings and above
    (``RUST_LOG``: torchft's Rust servers too, unless set)."""
    os.environ.setdefault("RUST_LOG", "warn")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)

"""Containers, checked in one place: image references and which engine (docker or podman) to use.

Standard library only: ``images/build`` imports it without the repository installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

# distribution/reference's grammar (the one `docker build -t` and `podman build -t` enforce):
# [domain[:port]/]path[/path...][:tag][@digest], lower-case path components.
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::{_TAG})?(?:@{_DIGEST})?")
_NAME_MAX = 255


def reference_error(ref: str) -> str | None:
    """Why ``ref`` is not a valid image reference (one line), or None when it is."""
    match = _REFERENCE.fullmatch(ref)
    if match is None:
        return (f"{ref!r} is not a valid image reference: expected [registry/]name[:tag]"
                "[@digest] with a lower-case name, e.g. torchx-templates:cpu or "
                "ghcr.io/org/torchx-templates:0.1.0-cpu")
    if len(match["name"]) > _NAME_MAX:
        return f"{ref!r} is not a valid image reference: the name is longer than {_NAME_MAX}"
    return None


ENGINES = ("docker", "podman")


class EngineError(Exception):
    """No usable container engine; the message is one line that says what to install or start."""


def _answers(cmd: list[str]) -> str | None:
    """stdout of ``cmd`` if it exits 0 within 20 s, else None."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def find_engine() -> str:
    """The container engine CLI to use: "docker" or "podman".

    ``$CONTAINER_ENGINE`` if set (it must be on PATH); else docker when its daemon answers and
    is not podman behind the Docker API (podman's own CLI then builds natively, with build
    secrets); else podman when installed. Raises EngineError otherwise.
    """
    chosen = os.environ.get("CONTAINER_ENGINE")
    if chosen:
        if chosen not in ENGINES:
            raise EngineError(f"CONTAINER_ENGINE={chosen}: expected one of {', '.join(ENGINES)}")
        if shutil.which(chosen) is None:
            raise EngineError(f"CONTAINER_ENGINE={chosen}, but {chosen} is not on PATH")
        return chosen
    docker = shutil.which("docker")
    if docker:
        server = _answers([docker, "version", "--format", "{{json .Server}}"])
        if server is not None and "podman" not in server.lower():
            return "docker"
    if shutil.which("podman"):
        return "podman"
    if docker:
        raise EngineError("docker is installed but its daemon does not answer and podman is "
                          "not installed; start the Docker daemon or install podman")
    raise EngineError("neither docker nor podman is installed; install one of them "
                      "(https://docs.docker.com/engine/install/, or apt-get install podman)")


def image_size(engine: str, image: str) -> int | None:
    """Size in bytes of a local image, or None when ``engine`` does not know it."""
    out = _answers([engine, "image", "inspect", "--format", "{{.Size}}", image])
    return int(out) if out and out.strip().isdigit() else None

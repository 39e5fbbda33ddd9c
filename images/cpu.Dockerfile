# syntax=docker/dockerfile:1
# torchx-templates, CPU: the repository installed with the CPU build of torch; every component's
# command (`torchrun ... -m trainers.<trainer>`) runs in it. Build with `images/build cpu`.
#
# Build arguments: BASE_IMAGE (any Debian bookworm image; CI makes one with debootstrap),
# TORCH_SPEC and TORCH_INDEX_URL (where the CPU wheel comes from; empty: only images/wheels/ and
# PyPI). Build context: the repository root; wheels in images/wheels/ are preferred to any index. An optional build
# secret `ca_bundle` (a PEM file) is the CA pip trusts, for TLS-intercepting proxies; it is
# mounted for the install step only and never stored in a layer.
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim
FROM ${BASE_IMAGE}

ARG TORCH_SPEC=torch==2.13.0+cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3-venv=3.11.2-1+b1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 1000 trainer \
    && useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash trainer

# Nothing writes under $HOME or the image at run time: caches go to /tmp (an emptyDir on
# Kubernetes, where the root filesystem is read-only), outputs to ./outputs (a volume there).
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    HOME=/home/trainer \
    XDG_CACHE_HOME=/tmp/.cache \
    TORCHINDUCTOR_CACHE_DIR=/tmp/.cache/torchinductor \
    TRITON_CACHE_DIR=/tmp/.cache/triton \
    MPLCONFIGDIR=/tmp/.cache/matplotlib \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Dependencies first (a layer that survives code changes), all pinned: torch here, the rest in
# images/requirements.txt, the lock images/lock resolves from pyproject.toml with this CPU build
# of torch. --no-deps: nothing outside the lock is installed; the `pip check` below fails the
# build if the lock lacks anything (a TORCH_SPEC whose dependencies differ, a hand-edited lock).
# Copied, not bind-mounted: podman caches a RUN by its text, so a changed bind-mounted file
# would not rebuild this layer.
COPY images/requirements.txt /tmp/requirements.txt
RUN --mount=type=bind,source=images/wheels,target=/tmp/wheels \
    --mount=type=secret,id=ca_bundle,required=false \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && python3 -m venv "$VIRTUAL_ENV" \
    && pip install --no-deps --find-links /tmp/wheels \
        ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
        "$TORCH_SPEC" -r /tmp/requirements.txt

WORKDIR /opt/torchx-templates
COPY pyproject.toml README.md LICENSE .torchxconfig ./
COPY components/ components/
COPY trainers/ trainers/
# A regular (non-editable) install: `python -m trainers.ddp` works from any directory. Its
# dependencies are the lock's, installed above: --no-deps, so that nothing unpinned is fetched
# here, and `pip check` fails the build if the lock lacks any (regenerate it with images/lock).
RUN pip install --no-deps --no-build-isolation . \
    && pip check \
    && rm -rf build ./*.egg-info \
    && install -d -o 1000 -g 1000 outputs

USER 1000:1000
CMD ["python", "-m", "trainers.ddp", "--help"]

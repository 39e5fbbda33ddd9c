# syntax=docker/dockerfile:1
# torchx-templates, CUDA: the repository installed with a CUDA build of torch, on NVIDIA's
# minimal CUDA image (the torch wheel brings its own cuBLAS, cuDNN and NCCL as pip packages; the
# base adds the driver-facing setup the NVIDIA container toolkit expects). Build with
# `images/build cuda`; run with GPUs (`--gpus all`, or a Kubernetes nvidia.com/gpu limit).
#
# Build arguments: BASE_IMAGE (an Ubuntu 24.04 CUDA image), TORCH_SPEC and TORCH_INDEX_URL (the
# CUDA wheel; keep its CUDA version at or below the base image's). Optional build secret
# `ca_bundle`: a PEM CA bundle pip trusts, mounted for the install step only.
ARG BASE_IMAGE=docker.io/nvidia/cuda:12.8.1-base-ubuntu24.04
FROM ${BASE_IMAGE}

ARG TORCH_SPEC=torch==2.13.0+cu128
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Ubuntu images ship a user `ubuntu` with uid 1000; the trainer takes that uid (Kubernetes
# runAsUser 1000 in the pods of components/schedulers/k8s/pod.py).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3-venv=3.12.3-0ubuntu2 \
    && rm -rf /var/lib/apt/lists/* \
    && if id -u ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi \
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
# images/requirements.txt, the lock images/lock resolves from pyproject.toml with torch's CPU
# build. pip resolves this step: the CUDA build adds its CUDA libraries (nvidia-*, triton), which
# it pins itself; a conflict between TORCH_SPEC and the lock fails here, and the `pip check`
# below fails the build if the lock lacks one of the repository's dependencies.
# Copied, not bind-mounted: podman caches a RUN by its text, so a changed bind-mounted file
# would not rebuild this layer.
COPY images/requirements.txt /tmp/requirements.txt
RUN --mount=type=bind,source=images/wheels,target=/tmp/wheels \
    --mount=type=secret,id=ca_bundle,required=false \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && python3 -m venv "$VIRTUAL_ENV" \
    && pip install --find-links /tmp/wheels \
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

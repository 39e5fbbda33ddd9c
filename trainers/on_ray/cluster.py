"""The Ray cluster of a ``python -m trainers.on_ray.train`` run: joining it (or starting a local
one) and checking, before anything waits, that it is there and can place the workers."""

from __future__ import annotations

import math
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

from trainers.errors import ConfigError


def check_address(address: str, timeout: float = 5.0) -> None:
    """ConfigError unless a gRPC server (as Ray's GCS and Ray Client are) answers at
    ``address`` (HOST:PORT or ray://HOST:PORT) within ``timeout`` seconds; ``auto`` is left to
    ``ray.init``.

    Why a probe of our own: Ray 2.60's ``ray.init(address=...)`` has no timeout and retries an
    address without a cluster behind it for minutes (each GCS connection attempt waits 30 s, up
    to 20 times); upstream declined a timeout argument (ray-project/ray#46863) and suggested a
    check of one's own, which this is: a TCP connection, then gRPC's own channel handshake."""
    if address == "auto":
        return
    host, port = host_port(address)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        raise ConfigError(
            f"--address {address}: no Ray cluster answers there ({err.strerror or err}); start "
            f"one with `ray start --head --port {port}`, pass its head's address, or drop "
            "--address to start a local cluster") from None
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return  # a TLS server waits for the cluster's certificates: only the TCP check applies
    if not _speaks_grpc(f"{host}:{port}", timeout):
        raise ConfigError(
            f"--address {address}: the service there is not a Ray cluster (no gRPC answer); "
            "pass the head's GCS address (HOST:6379 by default; not the dashboard's 8265) or "
            "ray://HOST:10001")


def host_port(address: str) -> tuple[str, int]:
    """The host and port of ``--address`` HOST:PORT or ray://HOST:PORT; ConfigError if it is
    neither (nor ``auto``, which has none)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--address {address}: expected HOST:PORT of the Ray head (e.g. "
                          "10.0.0.5:6379), ray://HOST:10001 or auto")
    return host, int(port)


def _speaks_grpc(target: str, timeout: float) -> bool:
    """Whether gRPC's channel to ``target`` gets READY (an HTTP/2 server answered) before it
    fails or ``timeout`` seconds pass."""
    import grpc

    settled = threading.Event()
    states: list[grpc.ChannelConnectivity] = []

    def watch(state: grpc.ChannelConnectivity) -> None:
        if state in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE):
            states.append(state)
            settled.set()

    with grpc.insecure_channel(target) as channel:
        channel.subscribe(watch, try_to_connect=True)
        settled.wait(timeout)
        channel.unsubscribe(watch)
    return states[:1] == [grpc.ChannelConnectivity.READY]


def connect(address: str | None, num_cpus: int | None) -> None:
    """Join the cluster at ``address`` or, without one, start a local cluster of ``num_cpus``
    CPUs (all of this machine's when None); ConfigError if there is no cluster to join."""
    import ray

    if address is None:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
        return
    check_address(address)
    try:
        ray.init(address=address, log_to_driver=True)
    except (ConnectionError, TimeoutError, RuntimeError) as err:
        lines = str(err).strip().splitlines() or [type(err).__name__]
        raise ConfigError(f"--address {address}: could not join a Ray cluster there "
                          f"({lines[0]}); pass the head's address (HOST:6379) or auto") from None


def placeable_workers(nodes: Sequence[dict[str, Any]], cpus: float, gpus: int) -> int:
    """How many workers needing ``cpus`` CPUs and ``gpus`` GPUs each the alive ``nodes`` (as
    ``ray.nodes()`` lists them) can hold at once."""
    total = 0
    for node in nodes:
        if not node.get("Alive", False):
            continue
        resources = node.get("Resources", {})
        fits = math.floor(resources.get("CPU", 0) / cpus + 1e-9)
        if gpus:
            fits = min(fits, math.floor(resources.get("GPU", 0) / gpus + 1e-9))
        total += fits
    return total


def check_resources(workers: int, cpus: float, gpus: int,
                    nodes: Sequence[dict[str, Any]]) -> None:
    """ConfigError if the cluster's ``nodes`` (``ray.nodes()``) cannot hold ``workers`` workers
    of ``cpus`` CPUs and ``gpus`` GPUs each, which Ray would otherwise wait for forever."""
    fits = placeable_workers(nodes, cpus, gpus)
    if fits >= workers:
        return
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", False)]
    has = ", ".join(_count(n, what) for n, what in (
        (len(alive), "node"), (sum(r.get("CPU", 0) for r in alive), "CPU"),
        (sum(r.get("GPU", 0) for r in alive), "GPU")))
    need = f"{cpus:g} CPU" + (f" and {gpus} GPU" if gpus else "")
    raise ConfigError(
        f"--workers {workers} need {need} each, but the Ray cluster ({has}) can place "
        f"only {fits}; pass --workers {fits} or fewer, lower --cpus-per-worker, add nodes, or "
        "pass --skip-resource-check if the cluster autoscales")


def _count(number: float, noun: str) -> str:
    return f"{number:g} {noun}" + ("" if number == 1 else "s")

"""Parse and check the extended kubernetes scheduler's run options (no Kubernetes client needed).

Every parser takes the option's raw value and returns typed values or raises
:class:`components.launch.ComponentArgumentError` with one line that names the option, the
expected form and an example. Formats avoid ``=`` and ``,`` inside an item because ``-cfg``
uses them to separate options; list items are separated by ``;`` (or ``,`` in ``-cfg``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from components.errors import ComponentArgumentError

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_QUANTITY = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


class PodOptionError(ComponentArgumentError):
    """A bad option or pod template in the checks both Kubernetes schedulers share: ``detail``
    is the line without a scheduler's name; the message is the ``kubernetes`` scheduler's, and
    another scheduler re-raises it under its own name
    (:meth:`components.schedulers.k8s_common.HardenedPods.errors_named`)."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"kubernetes: {detail}")
        self.detail = detail


def _fail(option: str, value: str, expected: str) -> PodOptionError:
    return PodOptionError(f"{option}={value!r} is invalid: {expected}")


def is_dns1123_label(name: str) -> bool:
    """True when ``name`` is a DNS-1123 label: lower-case alphanumerics and '-', <= 63."""
    return len(name) <= 63 and _DNS1123_LABEL.fullmatch(name) is not None


def is_dns1123_subdomain(name: str) -> bool:
    """True when ``name`` is a DNS-1123 subdomain: dot-separated labels, <= 253 characters."""
    return 0 < len(name) <= 253 and all(is_dns1123_label(p) for p in name.split("."))


def check_label(option: str, value: str) -> str:
    """``value`` if it is a DNS-1123 label (namespaces, job and task names), else raise."""
    if not is_dns1123_label(value):
        raise _fail(option, value, "must be a DNS-1123 label (lower-case letters, digits and "
                    "'-', starting and ending alphanumeric, at most 63), e.g. torchx-jobs")
    return value


def check_subdomain(option: str, value: str) -> str:
    """``value`` if it is a DNS-1123 subdomain (object names: secrets, claims, classes)."""
    if not is_dns1123_subdomain(value):
        raise _fail(option, value, "must be a DNS-1123 subdomain (lower-case letters, digits, "
                    "'-' and '.'), e.g. torchx-outputs")
    return value


def _is_label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return ((not prefix or is_dns1123_subdomain(prefix))
            and len(name) <= 63 and _LABEL_NAME.fullmatch(name) is not None)


def _is_label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and _LABEL_NAME.fullmatch(value) is not None)


def parse_node_selector(items: list[str]) -> dict[str, str]:
    """``KEY:VALUE`` items (label key, label value) as a nodeSelector map."""
    selector: dict[str, str] = {}
    for item in items:
        key, sep, value = item.rpartition(":")
        if not sep or not _is_label_key(key) or not _is_label_value(value):
            raise _fail("node_selector", item, "expected LABEL_KEY:LABEL_VALUE items, e.g. "
                        "node_selector=node.kubernetes.io/instance-type:m5.2xlarge")
        selector[key] = value
    return selector


def parse_tolerations(items: list[str]) -> list[dict[str, str]]:
    """``KEY:EFFECT`` (operator Exists) or ``KEY:VALUE:EFFECT`` (operator Equal) items."""
    tolerations = []
    for item in items:
        parts = item.split(":")
        key, effect = parts[0], parts[-1]
        ok = (len(parts) in (2, 3) and _is_label_key(key) and effect in EFFECTS
              and (len(parts) == 2 or _is_label_value(parts[1])))
        if not ok:
            raise _fail("tolerations", item, "expected KEY:EFFECT or KEY:VALUE:EFFECT items "
                        f"with EFFECT one of {', '.join(EFFECTS)}, e.g. "
                        "tolerations=nvidia.com/gpu:NoSchedule")
        toleration = {"key": key, "effect": effect}
        toleration.update({"operator": "Equal", "value": parts[1]} if len(parts) == 3
                          else {"operator": "Exists"})
        tolerations.append(toleration)
    return tolerations


@dataclass(frozen=True)
class SecretEnv:
    """One secret as environment: ``var`` from ``key`` of ``secret``, or all keys (var None)."""

    secret: str
    var: str | None = None
    key: str | None = None


def parse_secret_env(items: list[str]) -> list[SecretEnv]:
    """``VAR:SECRET:KEY`` (one variable from one key) or ``SECRET`` (every key) items."""
    out = []
    for item in items:
        parts = item.split(":")
        if len(parts) == 1 and is_dns1123_subdomain(parts[0]):
            out.append(SecretEnv(parts[0]))
        elif (len(parts) == 3 and _ENV_NAME.fullmatch(parts[0])
              and is_dns1123_subdomain(parts[1]) and _SECRET_KEY.fullmatch(parts[2])):
            out.append(SecretEnv(parts[1], parts[0], parts[2]))
        else:
            raise _fail("secret_env", item, "expected VAR:SECRET:KEY or SECRET items, e.g. "
                        "secret_env=HF_TOKEN:hf-token:token")
    return out


def _parse_mount(option: str, item: str, default_path: str | None) -> tuple[str, str]:
    name, sep, path = item.partition(":")
    path = path if sep else (default_path or "")
    if not is_dns1123_subdomain(name) or not path.startswith("/") or ":" in path:
        example = f"{option}=NAME:/ABSOLUTE/PATH"
        raise _fail(option, item, f"expected NAME{'[:PATH]' if default_path else ':PATH'} "
                    f"with NAME a DNS-1123 name and PATH absolute, e.g. {example}")
    return name, path.rstrip("/") or "/"


def parse_secret_volumes(items: list[str]) -> list[tuple[str, str]]:
    """``SECRET:/PATH`` items as (secret, mount path); mounted read-only."""
    return [_parse_mount("secret_volumes", item, None) for item in items]


def parse_pvc(value: str, default_path: str) -> tuple[str, str]:
    """``CLAIM[:/PATH]`` as (claim, mount path); the path defaults to ``default_path``."""
    return _parse_mount("checkpoint_pvc", value, default_path)


def parse_quantity(option: str, value: str) -> int:
    """A Kubernetes memory quantity (``512Mi``, ``2Gi``, ``1G``, ``1048576``) in bytes, > 0."""
    match = _QUANTITY.fullmatch(value)
    if match is None or Decimal(match.group(1)) <= 0:
        raise _fail(option, value, "expected a positive quantity such as 512Mi, 2Gi or 1G")
    unit = match.group(2) or ""
    return int(Decimal(match.group(1)) * (_BINARY.get(unit) or _DECIMAL.get(unit, 1)))


@dataclass(frozen=True)
class NodeShape:
    """What one node offers a pod: CPUs, memory in bytes and GPUs."""

    cpu: float
    memory: int
    gpu: int

    def __str__(self) -> str:
        return f"{self.cpu:g} CPUs/{self.memory / 2**30:g}Gi/{self.gpu} GPUs"


def parse_node_shapes(items: list[str]) -> list[NodeShape]:
    """``CPUS/MEMORY[/GPUS]`` items, e.g. ``8/32Gi`` or ``96/1100Gi/8``: the cluster's nodes."""
    shapes = []
    for item in items:
        parts = item.split("/")
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            cpu = float(Decimal(parts[0]))
            gpu = int(parts[2]) if len(parts) == 3 else 0
            if cpu <= 0 or gpu < 0:
                raise ValueError
            memory = parse_quantity("node_shapes", parts[1])
        except (ValueError, InvalidOperation, ComponentArgumentError):
            raise _fail("node_shapes", item, "expected CPUS/MEMORY[/GPUS] items, e.g. "
                        "node_shapes=8/32Gi;96/1100Gi/8") from None
        shapes.append(NodeShape(cpu, memory, gpu))
    return shapes

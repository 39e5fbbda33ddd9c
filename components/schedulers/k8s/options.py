"""Parse and check the run options of both Kubernetes schedulers (no Kubernetes client needed).

Every parser takes the scheduler's registered name (``kubernetes`` or ``kubernetes_jobset``)
and the option's raw value, and returns typed values or raises
:class:`components.errors.ComponentArgumentError` with one line that starts with that name and
names the option, the expected form and an example. Formats avoid ``=`` and ``,`` inside an
item because ``-cfg`` uses them to separate options; list items are separated by ``;`` (or
``,`` in ``-cfg``). Object names are checked as the API server would (DNS-1123), including the
names Kubernetes derives from the job's (:func:`check_derived_names`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from components.errors import ComponentArgumentError

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_QUANTITY = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def refuse(scheduler: str, detail: str) -> ComponentArgumentError:
    """The one-line error of scheduler ``scheduler`` (its registered name) saying ``detail``."""
    return ComponentArgumentError(f"{scheduler}: {detail}")


def _fail(scheduler: str, option: str, value: str, expected: str) -> ComponentArgumentError:
    return refuse(scheduler, f"{option}={value!r} is invalid: {expected}")


def is_dns1123_label(name: str) -> bool:
    """True when ``name`` is a DNS-1123 label: lower-case alphanumerics and '-', <= 63."""
    return len(name) <= 63 and _DNS1123_LABEL.fullmatch(name) is not None


def is_dns1123_subdomain(name: str) -> bool:
    """True when ``name`` is a DNS-1123 subdomain: dot-separated labels, <= 253 characters."""
    return 0 < len(name) <= 253 and all(is_dns1123_label(p) for p in name.split("."))


def check_label(scheduler: str, option: str, value: str) -> str:
    """``value`` if it is a DNS-1123 label (namespaces, job and task names), else raise."""
    if not is_dns1123_label(value):
        raise _fail(scheduler, option, value, "must be a DNS-1123 label (lower-case letters, "
                    "digits and '-', starting and ending alphanumeric, at most 63), e.g. "
                    "torchx-jobs")
    return value


def check_subdomain(scheduler: str, option: str, value: str) -> str:
    """``value`` if it is a DNS-1123 subdomain (object names: secrets, claims, classes)."""
    if not is_dns1123_subdomain(value):
        raise _fail(scheduler, option, value, "must be a DNS-1123 subdomain (lower-case "
                    "letters, digits, '-' and '.'), e.g. torchx-outputs")
    return value


def _is_label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return ((not prefix or is_dns1123_subdomain(prefix))
            and len(name) <= 63 and _LABEL_NAME.fullmatch(name) is not None)


def _is_label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and _LABEL_NAME.fullmatch(value) is not None)


def parse_node_selector(scheduler: str, items: list[str]) -> dict[str, str]:
    """``KEY:VALUE`` items (label key, label value) as a nodeSelector map."""
    selector: dict[str, str] = {}
    for item in items:
        key, sep, value = item.rpartition(":")
        if not sep or not _is_label_key(key) or not _is_label_value(value):
            raise _fail(scheduler, "node_selector", item, "expected LABEL_KEY:LABEL_VALUE "
                        "items, e.g. node_selector=node.kubernetes.io/instance-type:m5.2xlarge")
        selector[key] = value
    return selector


def parse_tolerations(scheduler: str, items: list[str]) -> list[dict[str, str]]:
    """``KEY:EFFECT`` (operator Exists) or ``KEY:VALUE:EFFECT`` (operator Equal) items."""
    tolerations = []
    for item in items:
        parts = item.split(":")
        key, effect = parts[0], parts[-1]
        ok = (len(parts) in (2, 3) and _is_label_key(key) and effect in EFFECTS
              and (len(parts) == 2 or _is_label_value(parts[1])))
        if not ok:
            raise _fail(scheduler, "tolerations", item, "expected KEY:EFFECT or "
                        f"KEY:VALUE:EFFECT items with EFFECT one of {', '.join(EFFECTS)}, e.g. "
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


def parse_secret_env(scheduler: str, items: list[str]) -> list[SecretEnv]:
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
            raise _fail(scheduler, "secret_env", item, "expected VAR:SECRET:KEY or SECRET "
                        "items, e.g. secret_env=HF_TOKEN:hf-token:token")
    return out


def _parse_mount(scheduler: str, option: str, item: str,
                 default_path: str | None) -> tuple[str, str]:
    name, sep, path = item.partition(":")
    path = path if sep else (default_path or "")
    if not is_dns1123_subdomain(name) or not path.startswith("/") or ":" in path:
        example = f"{option}=NAME:/ABSOLUTE/PATH"
        raise _fail(scheduler, option, item,
                    f"expected NAME{'[:PATH]' if default_path else ':PATH'} with NAME a "
                    f"DNS-1123 name and PATH absolute, e.g. {example}")
    return name, path.rstrip("/") or "/"


def parse_secret_volumes(scheduler: str, items: list[str]) -> list[tuple[str, str]]:
    """``SECRET:/PATH`` items as (secret, mount path); mounted read-only."""
    return [_parse_mount(scheduler, "secret_volumes", item, None) for item in items]


def parse_pvc(scheduler: str, value: str, default_path: str) -> tuple[str, str]:
    """``CLAIM[:/PATH]`` as (claim, mount path); the path defaults to ``default_path``."""
    return _parse_mount(scheduler, "checkpoint_pvc", value, default_path)


def parse_quantity(scheduler: str, option: str, value: str) -> int:
    """A Kubernetes memory quantity (``512Mi``, ``2Gi``, ``1G``, ``1048576``) in bytes, > 0."""
    match = _QUANTITY.fullmatch(value)
    if match is None or Decimal(match.group(1)) <= 0:
        raise _fail(scheduler, option, value,
                    "expected a positive quantity such as 512Mi, 2Gi or 1G")
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


def parse_node_shapes(scheduler: str, items: list[str]) -> list[NodeShape]:
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
            memory = parse_quantity(scheduler, "node_shapes", parts[1])
        except (ValueError, InvalidOperation, ComponentArgumentError):
            raise _fail(scheduler, "node_shapes", item, "expected CPUS/MEMORY[/GPUS] items, "
                        "e.g. node_shapes=8/32Gi;96/1100Gi/8") from None
        shapes.append(NodeShape(cpu, memory, gpu))
    return shapes


def check_object_names(scheduler: str, cfg: Mapping[str, Any]) -> None:
    """Raise unless the namespace is a DNS-1123 label and the service account and priority
    class (when given) are DNS-1123 subdomains."""
    check_label(scheduler, "namespace", cfg.get("namespace") or "default")
    for key in ("service_account", "priority_class"):
        if cfg.get(key):
            check_subdomain(scheduler, key, cfg[key])


# The longest id TorchX's ``make_unique`` appends to the app name: ``random_id`` spells a 64-bit
# value in base 20 (first character) then base 29, and 20 * 29**12 < 2**64 <= 20 * 29**13.
MAX_APP_ID_CHARS = 14


def check_derived_names(scheduler: str, job_name: str, names: list[tuple[str, str]]) -> None:
    """Raise unless each of ``names`` ((what, value) pairs, each value starting with
    ``job_name``, TorchX's APP-ID) stays a DNS-1123 label with the longest id TorchX can append.

    Checked at that length, not at this submit's random id, so that the same app and role names
    are accepted or refused on every submit."""
    pad = "x" * (MAX_APP_ID_CHARS - len(job_name.rsplit("-", 1)[-1]))
    for what, value in names:
        longest = job_name + pad + value[len(job_name):]
        if not is_dns1123_label(longest):
            raise refuse(scheduler, f"{what} {value!r} can reach {len(longest)} characters, over "
                         "the 63 of a DNS-1123 label (TorchX appends an id of up to "
                         f"{MAX_APP_ID_CHARS} characters to the app name); shorten the app or "
                         "role names")

"""What ``--tracker`` names: the experiment trackers a run reports to, and their checks.

No torch and no tracker package is imported here: a component checks the names at submit
time, and the trainer's own process (:func:`trainers.core.entry.train_in_group`) checks that
the chosen trackers' packages are installed before anything trains (:func:`check_trackers`).
"""

from __future__ import annotations

import importlib.util

from trainers.errors import ConfigError

# Tracker name -> (the module it imports, the extra that installs it; None: a dependency).
TRACKERS: dict[str, tuple[str, str | None]] = {
    "tensorboard": ("tensorboard", None),  # what torch.utils.tensorboard needs
    "mlflow": ("mlflow", "mlflow"),
    "wandb": ("wandb", "wandb"),
}


def chosen_trackers(tracker: str, tensorboard: bool = True) -> tuple[str, ...]:
    """The trackers ``--tracker`` names (comma-separated; a repeated flag's values are joined
    by commas), in order and once each; ``none`` alone names none. ``tensorboard=False``
    (``--tensorboard false``, the older spelling) drops TensorBoard.

    Raises :class:`ConfigError` for an unknown name or ``none`` with others."""
    names = [name.strip() for name in tracker.split(",") if name.strip()]
    unknown = [name for name in names if name not in TRACKERS and name != "none"]
    if unknown:
        raise ConfigError(f"--tracker {','.join(unknown)} is not a tracker; pick from "
                          f"{', '.join(TRACKERS)} or none (comma-separated)")
    if "none" in names and len(names) > 1:
        raise ConfigError(f"--tracker {tracker}: none cannot be combined with another tracker; "
                          "drop none or the others")
    return tuple(name for name in dict.fromkeys(names)
                 if name != "none" and (tensorboard or name != "tensorboard"))


def missing_package(name: str) -> str | None:
    """The one-line fix when tracker ``name``'s package is not installed here, else None."""
    module, extra = TRACKERS[name]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or an import blocked
        found = False
    if found:
        return None
    install = f"pip install 'torchx-templates[{extra}]'" if extra else f"pip install {module}"
    return (f"--tracker {name} needs the {module} package, which is not installed: {install} "
            f"(or drop {name} from --tracker)")


def check_trackers(tracker: str, tensorboard: bool, packages: bool) -> None:
    """Check ``--tracker``'s names and, with ``packages``, that each chosen tracker's package
    is installed on this machine. Raises :class:`ConfigError` in one line."""
    for name in chosen_trackers(tracker, tensorboard):
        reason = missing_package(name) if packages else None
        if reason:
            raise ConfigError(reason)

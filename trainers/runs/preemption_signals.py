"""Which signals ask a run to save and stop, and the exit status of a rank that did.

A preemption signal (``--preemption-signals``, SIGTERM and SIGUSR1 by default) makes every
rank finish its step, save a checkpoint of that step and exit with ``128 + signal`` (143 for
SIGTERM, 138 for SIGUSR1): the status a process killed by that signal has, which torchrun's
restarts, Slurm's requeue and Kubernetes' restart policies already treat as an interruption.
"""

from __future__ import annotations

import signal

from trainers.errors import ConfigError

DEFAULT = "SIGTERM,SIGUSR1"
_UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)


def parse_signals(value: str, flag: str = "--preemption-signals") -> tuple[signal.Signals, ...]:
    """The signals ``value`` names, comma-separated, with or without ``SIG`` (``TERM,USR1``);
    ``none`` names none. Raises :class:`ConfigError` naming the fix."""
    if value.strip().lower() in ("", "none"):
        return ()
    signals: list[signal.Signals] = []
    for name in (part.strip().upper() for part in value.split(",")):
        full = name if name.startswith("SIG") else "SIG" + name
        try:
            sig = signal.Signals[full]
        except KeyError:
            raise ConfigError(f"{flag} {value}: {name or 'an empty name'} is not a signal; pass "
                              f"names such as {DEFAULT} (see `kill -l`), or none") from None
        if sig in _UNCATCHABLE:
            raise ConfigError(f"{flag} {value}: {sig.name} cannot be caught, so no checkpoint "
                              f"can be saved on it; pass catchable signals such as {DEFAULT}")
        if sig not in signals:
            signals.append(sig)
    return tuple(signals)


def exit_status(sig: signal.Signals) -> int:
    """The exit status of a rank that saved and stopped on ``sig``: 128 + its number."""
    return 128 + int(sig)

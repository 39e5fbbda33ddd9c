"""Preemption: a signal asks the run to stop; the ranks agree on the step to save.

:class:`PreemptionWatch` installs a handler for each preemption signal that only records it
(a second signal, say during the save, changes nothing). After every step the ranks agree in
one small all-reduce on the host (gloo, whatever the training backend) whether any of them was
signalled, so all of them save the same step and stop together (:mod:`trainers.core.loop`);
the process then exits ``128 + signal`` (:func:`trainers.runs.preemption_signals.exit_status`).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from trainers.core.distributed import DistEnv

# A launcher's own preemption notice, asked once per step on every rank (e.g. Ray's node
# drain, trainers.on_ray.train): True once this rank's node is going away; handled as a SIGTERM.
Notice = Callable[[], bool]


class PreemptionWatch:
    """Records the preemption signals this process receives while it is open (a context
    manager; the previous handlers come back on exit).

    Handlers can be installed only from the main thread; a loop run from another thread (Ray
    Train's worker thread) learns of a preemption from its launcher's ``notice`` instead.
    """

    def __init__(self, signals: tuple[signal.Signals, ...], env: DistEnv,
                 notice: Notice | None = None) -> None:
        self.signals = signals
        self.env = env
        self.notice = notice
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}
        # The flag lives on the CPU and is agreed over gloo: on a GPU an all-reduce of a device
        # tensor read back with .item() would wait for the whole step's kernels every step (the
        # loop reads its metrics only at flush points). Creating the group is collective.
        self._flag = torch.zeros(1, dtype=torch.int64)
        self._group = (dist.new_group(backend="gloo")
                       if env.world_size > 1 and env.backend != "gloo" else None)

    def __enter__(self) -> PreemptionWatch:
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.request(signal.Signals(signum))

    def request(self, sig: signal.Signals) -> None:
        """Ask the run to save and stop at the next step boundary (idempotent)."""
        if self.received is None:
            self.received = sig
            print(f"rank {self.env.rank} got {sig.name}: saving at the end of this step, then "
                  "stopping for the scheduler to restart the job", flush=True)

    def agreed(self) -> signal.Signals | None:
        """The signal of any rank, the same on every rank (collective: every rank calls it
        after every step); None while no rank was signalled."""
        if self.received is None and self.notice is not None and self.notice():
            print(f"rank {self.env.rank}: the launcher reports that this job's node is being "
                  "preempted; handling it as a SIGTERM", flush=True)
            self.request(signal.SIGTERM)
        self._flag.fill_(int(self.received or 0))
        if self.env.world_size > 1:
            dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group)
        value = int(self._flag.item())
        return signal.Signals(value) if value else None

"""What a training step is made of: compute, exposed communication, data wait and host
overhead, from the time intervals a profiler recorded.

A step's window is split in that order of precedence:

- **data wait**: the main thread inside the data loader (``enumerate(DataLoader)...``);
- **compute**: the device busy with work that is not communication (on a GPU its kernels, on
  the CPU the main thread's operators, which are the device's work there) outside data wait;
- **exposed communication**: a collective running (any thread, or a communication kernel)
  while the device computes nothing and the host is not loading data: the communication the
  step waits for, not what overlaps compute;
- **host overhead**: the rest: the device idle while the host runs Python, launches work or
  waits on something that is neither data nor a collective.

Intervals are ``(start, end)`` pairs in one clock (microseconds, as the profiler records them).
Plain Python without torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Interval = tuple[float, float]

# Profiler event names of communication: gloo's and NCCL's work (their threads or kernels),
# c10d's operators, the functional collectives' waits, and the profiler's own collective record.
COMM_MARKERS = ("gloo:", "nccl", "c10d::", "_c10d_functional", "record_param_comms")
# The data loader's iteration, as torch.utils.data records it.
DATA_PREFIX = "enumerate(DataLoader)"


def is_comm(name: str) -> bool:
    """Whether a profiler event named ``name`` is communication."""
    lowered = name.lower()
    return any(marker in lowered for marker in COMM_MARKERS)


def is_data(name: str) -> bool:
    """Whether a profiler event named ``name`` is the data loader producing a batch."""
    return name.startswith(DATA_PREFIX)


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The sorted, disjoint intervals covering exactly what ``intervals`` cover."""
    merged: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def subtract(keep: Sequence[Interval], remove: Sequence[Interval]) -> list[Interval]:
    """What of ``keep`` lies outside ``remove`` (both as :func:`union` returns them)."""
    result: list[Interval] = []
    j = 0
    for start, end in keep:
        while j < len(remove) and remove[j][1] <= start:
            j += 1
        k, cursor = j, start
        while k < len(remove) and remove[k][0] < end:
            if remove[k][0] > cursor:
                result.append((cursor, remove[k][0]))
            cursor = max(cursor, remove[k][1])
            k += 1
        if cursor < end:
            result.append((cursor, end))
    return result


def within(intervals: Iterable[Interval], window: Interval) -> list[Interval]:
    """``intervals`` cut to ``window``, as :func:`union` returns them."""
    lo, hi = window
    return union((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi)


def measure(intervals: Iterable[Interval]) -> float:
    """The total length of disjoint ``intervals``."""
    return sum(end - start for start, end in intervals)


@dataclass(frozen=True)
class Breakdown:
    """One step (or the mean of several) in seconds: ``step_s`` = ``compute_s`` +
    ``exposed_comm_s`` + ``data_wait_s`` + ``host_s``."""

    step_s: float
    compute_s: float
    exposed_comm_s: float
    data_wait_s: float
    host_s: float

    PARTS = ("compute_s", "exposed_comm_s", "data_wait_s", "host_s")

    def share(self, part: str) -> float:
        """``part``'s share of the step."""
        return getattr(self, part) / self.step_s if self.step_s > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        return {"step_s": self.step_s, **{part: getattr(self, part) for part in self.PARTS}}


def step_breakdown(window: Interval, compute: Iterable[Interval], comm: Iterable[Interval],
                   data: Iterable[Interval], blocking: Iterable[Interval] = (),
                   unit_s: float = 1e-6) -> Breakdown:
    """The breakdown of one step ``window`` from the intervals of the device's ``compute``, of
    ``comm`` (communication anywhere: it is exposed where the device computes nothing and the
    host loads no data) and of the host's ``data`` loading, each in units of ``unit_s``
    seconds. ``blocking`` are the communication intervals on the device's own timeline (on
    the CPU: collectives the main thread runs or waits for inside an operator): they are
    communication, not compute."""
    comm_u = within([*comm, *blocking], window)
    data_u = within(data, window)
    compute_u = subtract(subtract(within(compute, window), union(within(blocking, window))),
                         data_u)
    exposed = subtract(subtract(comm_u, compute_u), data_u)
    step = window[1] - window[0]
    parts = [measure(data_u), measure(compute_u), measure(exposed)]
    return Breakdown(step_s=step * unit_s, compute_s=parts[1] * unit_s,
                     exposed_comm_s=parts[2] * unit_s, data_wait_s=parts[0] * unit_s,
                     host_s=max(0.0, step - sum(parts)) * unit_s)


def mean_breakdown(breakdowns: Sequence[Breakdown]) -> Breakdown:
    """The mean of ``breakdowns`` (non-empty), part by part."""
    n = len(breakdowns)
    return Breakdown(**{key: sum(getattr(b, key) for b in breakdowns) / n
                        for key in ("step_s", *Breakdown.PARTS)})


def breakdown_of(record: dict[str, float]) -> Breakdown:
    """A :class:`Breakdown` read back from :meth:`Breakdown.to_dict`."""
    return Breakdown(**{key: float(record[key]) for key in ("step_s", *Breakdown.PARTS)})

"""``--profile-steps N``: torch.profiler over an attempt's last N steps, split into compute,
exposed communication, data wait and host overhead (:mod:`trainers.sizing.step_breakdown`).

The loop calls :meth:`StepProfiler.step` after every step and :meth:`StepProfiler.report` once
the steps are done. The step before the profiled ones is the profiler's warm-up. At the end,
every rank's breakdown is gathered to rank 0. Rank 0 writes ``profile.json`` into the run
directory (the profiled steps, each rank's mean breakdown, and the mean over ranks) and its
own Chrome trace as ``profile-trace.json`` (open it in Perfetto or ``chrome://tracing``). It
also prints one line with the split.

On a GPU the device's timeline is its kernels (NCCL's are communication); on the CPU it is the
main thread's operators, and communication is gloo's threads and c10d's operators.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule

from trainers.runs.storage import RunPath, write_bytes_atomic
from trainers.sizing.step_breakdown import (
    Breakdown,
    Interval,
    breakdown_of,
    is_comm,
    is_data,
    mean_breakdown,
    step_breakdown,
)

PROFILE_FILE = "profile.json"
TRACE_FILE = "profile-trace.json"
_STEP_PREFIX = "ProfilerStep"  # "ProfilerStep#N", listed as "ProfilerStep*"


@dataclass
class Timeline:
    """A profile's intervals (microseconds): the step ``windows``, and the ``compute``,
    ``comm``, ``data`` and ``blocking`` intervals of :func:`step_breakdown`."""

    windows: list[Interval] = field(default_factory=list)
    compute: list[Interval] = field(default_factory=list)
    comm: list[Interval] = field(default_factory=list)
    data: list[Interval] = field(default_factory=list)
    blocking: list[Interval] = field(default_factory=list)


def event_intervals(events: Any) -> Timeline:
    """The :class:`Timeline` of a profiler's ``events`` (:meth:`torch.profiler.profile.events`):
    on a GPU its kernels (NCCL's communication, the rest compute); on the CPU the main
    thread's operators (compute; its collectives blocking), and every thread's collectives."""
    steps = [e for e in events if e.name.startswith(_STEP_PREFIX)]
    main = steps[0].thread if steps else None
    on_gpu = any(e.device_type == DeviceType.CUDA for e in events)
    timeline = Timeline(windows=sorted((float(s.time_range.start), float(s.time_range.end))
                                       for s in steps))
    for e in events:
        span = (float(e.time_range.start), float(e.time_range.end))
        if e.device_type == DeviceType.CUDA:
            (timeline.comm if is_comm(e.name) else timeline.compute).append(span)
        elif e.device_type != DeviceType.CPU or e.name.startswith(_STEP_PREFIX):
            continue
        elif is_data(e.name):
            if e.thread == main:
                timeline.data.append(span)
        elif on_gpu:
            continue  # the host's side of kernels: launches, not the device's time
        elif is_comm(e.name):
            (timeline.blocking if e.thread == main else timeline.comm).append(span)
        elif e.thread == main:
            timeline.compute.append(span)
    return timeline


def breakdown_of_events(events: Any) -> Breakdown | None:
    """The mean breakdown of the profiled steps in ``events``; None when there were none."""
    t = event_intervals(events)
    if not t.windows:
        return None
    return mean_breakdown([step_breakdown(w, t.compute, t.comm, t.data, t.blocking)
                           for w in t.windows])


class StepProfiler:
    """Profiles the last ``steps`` of the attempt's steps ``first``..``last`` (0: off); a
    context manager whose :meth:`step` the loop calls after each step."""

    def __init__(self, steps: int, first: int, last: int, device: torch.device) -> None:
        attempt = last - first + 1
        self.active = min(steps, attempt - 1)
        self.first_profiled = last - self.active + 1
        self.last = last
        self._events: Any = None
        self._trace: bytes | None = None
        self._profile: profile | None = None
        if self.active > 0:
            activities = [ProfilerActivity.CPU]
            if device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            self._profile = profile(
                activities=activities, on_trace_ready=self._keep,
                schedule=schedule(wait=attempt - 1 - self.active, warmup=1, active=self.active,
                                  repeat=1))

    def __enter__(self) -> StepProfiler:
        if self._profile is not None:
            self._profile.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._profile is not None:
            self._profile.__exit__(kind, error, trace)

    def step(self) -> None:
        """A step ended."""
        if self._profile is not None:
            self._profile.step()

    def _keep(self, prof: profile) -> None:
        self._events = prof.events()
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / TRACE_FILE
            prof.export_chrome_trace(str(path))
            self._trace = path.read_bytes()

    def report(self, run_dir: RunPath, rank: int, say: Any) -> dict[str, Any] | None:
        """Gather every rank's breakdown of the profiled steps to rank 0, which writes
        ``profile.json`` and the trace into ``run_dir`` and ``say``s the split; collective
        (every rank calls it). None (and nothing written) when no step was profiled (a
        preempted attempt ends before its profiled steps)."""
        if self._profile is None or self._events is None:
            return None
        mine = breakdown_of_events(self._events)
        records = [mine.to_dict() if mine else None]
        if dist.is_initialized():
            records = [None] * dist.get_world_size()
            dist.all_gather_object(records, mine.to_dict() if mine else None)
        if rank != 0:
            return None
        found = [r for r in records if r is not None]
        mean = mean_breakdown([breakdown_of(r) for r in found])
        report = {"steps": [self.first_profiled, self.last], "ranks": records,
                  "mean": mean.to_dict()}
        write_bytes_atomic(run_dir / PROFILE_FILE, json.dumps(report, indent=1).encode())
        if self._trace is not None:
            write_bytes_atomic(run_dir / TRACE_FILE, self._trace)
        say(f"profile of steps {self.first_profiled}-{self.last} (mean over "
            f"{len(found)} ranks): " + describe(mean) + f"; {run_dir / PROFILE_FILE}, trace "
            f"{run_dir / TRACE_FILE}")
        return report


def describe(b: Breakdown) -> str:
    """``b`` as one line: milliseconds and share of each part."""
    names = {"compute_s": "compute", "exposed_comm_s": "exposed communication",
             "data_wait_s": "data wait", "host_s": "host overhead"}
    parts = ", ".join(f"{names[p]} {getattr(b, p) * 1e3:.1f} ms ({b.share(p):.0%})"
                      for p in Breakdown.PARTS)
    return f"step {b.step_s * 1e3:.1f} ms: {parts}"

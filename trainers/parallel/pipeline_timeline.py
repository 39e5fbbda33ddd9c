"""What a pipeline stage did when: per micro-batch forward/backward intervals and activations.

:class:`TimedStage` is a ``PipelineStage`` that records, for every micro-batch, when its
forward and its backward started and ended (``time.perf_counter``, one clock for every process
on a machine), and the bytes of activations that autograd holds for backward (tensors saved by
the stage's forward that are not parameters, each storage counted once, from the moment it is
saved until backward frees it), with their peak. :func:`efficiency` turns one step's intervals
into each stage's busy share and the pipeline's efficiency.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.distributed.pipelining import PipelineStage


@dataclass
class Interval:
    """One forward (``F``) or backward (``B``) of one micro-batch on one stage."""

    stage: int
    microbatch: int
    kind: str
    start: float
    end: float


class _ActivationMeter:
    """Bytes of saved-for-backward activations alive now, and their peak."""

    def __init__(self) -> None:
        self.live: dict[int, list[int]] = {}  # storage address -> [bytes, references]
        self.bytes = 0
        self.peak = 0

    def pack(self, tensor: torch.Tensor) -> Any:
        if isinstance(tensor, torch.nn.Parameter) or (tensor.is_leaf and tensor.requires_grad):
            return tensor
        return _Saved(tensor, self)

    @staticmethod
    def unpack(saved: Any) -> torch.Tensor:
        return saved.tensor if isinstance(saved, _Saved) else saved

    def add(self, key: int, size: int) -> None:
        entry = self.live.setdefault(key, [size, 0])
        if entry[1] == 0:
            self.bytes += size
            self.peak = max(self.peak, self.bytes)
        entry[1] += 1

    def remove(self, key: int) -> None:
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.bytes -= entry[0]
            del self.live[key]


class _Saved:
    """A saved tensor that tells the meter when autograd lets go of it."""

    __slots__ = ("tensor", "meter", "key")

    def __init__(self, tensor: torch.Tensor, meter: _ActivationMeter) -> None:
        storage = tensor.untyped_storage()
        self.tensor, self.meter, self.key = tensor, meter, storage.data_ptr()
        meter.add(self.key, storage.nbytes())

    def __del__(self) -> None:
        self.meter.remove(self.key)


class TimedStage(PipelineStage):
    """A PipelineStage that records its compute intervals and activation memory."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.intervals: list[Interval] = []
        self.meter = _ActivationMeter()

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(self.meter.pack, self.meter.unpack):
            out = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        self.intervals.append(Interval(self.stage_index, fwd_chunk_id, "F", start,
                                       time.perf_counter()))
        return out

    def backward_one_chunk(self, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)
        self.intervals.append(Interval(self.stage_index, bwd_chunk_id, "B", start,
                                       time.perf_counter()))
        return out

    def take_record(self) -> dict[str, Any]:
        """This step's intervals and activation peak; resets both for the next step."""
        record = {"stage": self.stage_index, "activation_peak_bytes": self.meter.peak,
                  "intervals": [asdict(i) for i in self.intervals]}
        self.intervals = []
        self.meter.peak = self.meter.bytes
        return record


def efficiency(intervals: list[dict[str, Any]]) -> dict[str, Any]:
    """Busy share of each stage (in stage order) over one step's span, and their mean: the
    pipeline efficiency.

    The span runs from the first forward's start to the last backward's end over all stages;
    a stage is busy while it runs a forward or backward of its own.
    """
    start = min(i["start"] for i in intervals)
    span = max(i["end"] for i in intervals) - start
    busy: dict[int, float] = {}
    for i in intervals:
        busy[i["stage"]] = busy.get(i["stage"], 0.0) + i["end"] - i["start"]
    shares = [value / span for _, value in sorted(busy.items())]
    return {"span_s": span, "busy_share": shares, "efficiency": sum(shares) / len(shares)}

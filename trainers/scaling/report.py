"""What ``trainers.scaling`` concludes from its runs: tokens/s, the scaling efficiency, each
step's breakdown, and the pitfalls it sees, each with its fix. Plain Python without torch.

A phase is one run of the trainer at one size (1 process, G processes, N nodes x G). Its
throughput comes from the trainer's own step timers over steps the profiler did not touch;
its breakdown from the profiled steps (:mod:`trainers.sizing.step_breakdown`), averaged
over the ranks. The scaling efficiency of a phase is its tokens/s per device over the
1-process run's: weak scaling, each data-parallel replica keeping the same batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainers.sizing.step_breakdown import Breakdown

# Above these shares of a step a part is a pitfall; below this efficiency scaling is
# sub-linear and the report names the part of the step that grew most.
DATA_WAIT_SHARE = 0.05
EXPOSED_COMM_SHARE = 0.15
SUBLINEAR_EFFICIENCY = 0.90
PART_NAMES = {"compute_s": "compute", "exposed_comm_s": "exposed communication",
              "data_wait_s": "data wait", "host_s": "host overhead"}


@dataclass(frozen=True)
class Phase:
    """One run: ``nodes`` x ``procs_per_node`` processes, the whole job's ``tokens_per_s``,
    the mean ``breakdown`` of its profiled steps, ``tokens_per_replica``: tokens each
    data-parallel replica trains on per step."""

    name: str
    nodes: int
    procs_per_node: int
    tokens_per_s: float
    breakdown: Breakdown
    tokens_per_replica: int

    @property
    def devices(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def per_device(self) -> float:
        return self.tokens_per_s / self.devices

    def to_dict(self, base: Phase) -> dict[str, Any]:
        return {"name": self.name, "nodes": self.nodes, "procs_per_node": self.procs_per_node,
                "tokens_per_s": self.tokens_per_s, "tokens_per_s_per_device": self.per_device,
                "efficiency": efficiency(base, self), "tokens_per_replica": self.tokens_per_replica,
                "breakdown": self.breakdown.to_dict()}


@dataclass(frozen=True)
class Facts:
    """What the pitfalls need of the trainer's configuration: the trainer, its
    ``--num-workers``, ``--tp``, ``--grad-accum``, and duplicated sequences among the
    ``sampled`` ones the ranks read in one step (0 when the sharding is right)."""

    trainer: str
    num_workers: int
    tp: int
    grad_accum: int
    duplicated: int
    sampled: int


@dataclass(frozen=True)
class Pitfall:
    """A problem seen in the runs: ``kind`` (data, batch, duplicates, placement, scaling) and
    one line naming the evidence and the fix."""

    kind: str
    message: str


def efficiency(base: Phase, phase: Phase) -> float:
    """``phase``'s tokens/s per device over the 1-process ``base``'s."""
    return phase.per_device / base.per_device if base.per_device > 0 else 0.0


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def pitfalls(phases: Sequence[Phase], facts: Facts) -> list[Pitfall]:
    """The pitfalls ``phases`` (the 1-process run first) and ``facts`` show, each once."""
    base, found = phases[0], []
    data_phase = max(phases, key=lambda p: p.breakdown.share("data_wait_s"))
    if data_phase.breakdown.share("data_wait_s") > DATA_WAIT_SHARE:
        more = max(2, 2 * facts.num_workers)
        found.append(Pitfall("data", (
            f"data loading: {data_phase.name} waits {data_phase.breakdown.share('data_wait_s'):.0%}"
            f" of each step on its batches (--num-workers {facts.num_workers}); pass "
            f"--num-workers {more} so worker processes load ahead")))
    comm_phase = max(phases, key=lambda p: p.breakdown.share("exposed_comm_s"))
    if comm_phase.breakdown.share("exposed_comm_s") > EXPOSED_COMM_SHARE:
        found.append(Pitfall("batch", (
            f"batch per device too small for the communication: {comm_phase.name} waits "
            f"{comm_phase.breakdown.share('exposed_comm_s'):.0%} of each step on collectives "
            f"({_ms(comm_phase.breakdown.exposed_comm_s)}) with "
            f"{comm_phase.tokens_per_replica:,} tokens per replica; try {comm_fixes(facts)}")))
    if facts.duplicated:
        found.append(Pitfall("duplicates", (
            f"duplicated samples across ranks: {facts.duplicated} of the {facts.sampled} "
            "sequences the ranks read in one step repeat another's; the training set is "
            "smaller than a global batch or not sharded by rank: add data (--train-samples, "
            "--data) or lower --batch-size")))
    for phase in phases:
        if phase.nodes > 1 and facts.tp > phase.procs_per_node:
            found.append(Pitfall("placement", (
                f"tensor parallel across nodes: --tp {facts.tp} spans {phase.name}'s nodes "
                f"({phase.procs_per_node} processes each), so every block's all-reduces cross "
                f"the network; keep --tp <= {phase.procs_per_node} (a divisor) and scale "
                "across nodes with data or pipeline parallelism")))
            break
    for phase in phases[1:]:
        if efficiency(base, phase) < SUBLINEAR_EFFICIENCY:
            found.append(Pitfall("scaling", sublinear_cause(base, phase, facts)))
    return found


def comm_fixes(facts: Facts) -> str:
    """What hides or shrinks the communication of ``facts``'s trainer, as one phrase."""
    if facts.tp > 1:
        return (f"a smaller --tp than {facts.tp} (its all-reduces in every block are on the "
                "critical path and grow with the tokens, not the batch), scaling with data "
                "parallelism (trainers.fsdp) instead")
    fixes = ["a larger batch per device (--batch-size)",
             "gradient accumulation (--grad-accum: one reduction per step)"]
    if facts.trainer == "ddp":
        fixes.append("--grad-reduce-dtype bf16 (half the bytes)")
    return ", or ".join(fixes)


def sublinear_cause(base: Phase, phase: Phase, facts: Facts) -> str:
    """Why ``phase`` scales sub-linearly: the part of the step that grew most over ``base``."""
    growth = {part: getattr(phase.breakdown, part) - getattr(base.breakdown, part)
              for part in PART_NAMES}
    part = max(growth, key=lambda p: growth[p])
    was, now = getattr(base.breakdown, part), getattr(phase.breakdown, part)
    head = (f"sub-linear scaling: {phase.name} reaches {efficiency(base, phase):.2f} of 1 "
            f"process's tokens/s per device; the step's {PART_NAMES[part]} grew most "
            f"({_ms(was)} -> {_ms(now)})")
    causes = {
        "compute_s": "the processes slow each other's compute (shared cores or memory "
                     "bandwidth: on CPUs keep processes x OMP_NUM_THREADS <= cores)",
        "exposed_comm_s": f"the collectives are not hidden behind compute; try "
                          f"{comm_fixes(facts)}",
        "data_wait_s": "the data loader cannot keep up with more processes: more "
                       "--num-workers",
        "host_s": "the device waits on the host (Python, launches, synchronisation, "
                  "stragglers); try --compile, or a larger batch per step",
    }
    return f"{head}: {causes[part]}"


def table(phases: Sequence[Phase]) -> str:
    """The phases as a Markdown table: tokens/s, per device, efficiency and the breakdown."""
    base = phases[0]
    lines = ["| run | devices | tokens/s | per device | efficiency | step | compute | "
             "exposed comm | data wait | host |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for p in phases:
        b = p.breakdown
        parts = " | ".join(f"{_ms(getattr(b, part))} ({b.share(part):.0%})" for part in PART_NAMES)
        lines.append(f"| {p.name} | {p.devices} | {p.tokens_per_s:,.0f} | {p.per_device:,.0f} | "
                     f"{efficiency(base, p):.2f} | {_ms(b.step_s)} | {parts} |")
    return "\n".join(lines)

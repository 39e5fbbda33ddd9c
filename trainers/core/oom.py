"""Out of memory: say what the step held and what to try next, instead of a bare trace."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import torch

from trainers.core.metrics import peak_memory_bytes
from trainers.options.train_config import TrainConfig
from trainers.options.trainer_table import TRAINERS
from trainers.planning.planner import GIB, job_candidate


def is_out_of_memory(err: BaseException) -> bool:
    """A CUDA out-of-memory error or a failed CPU allocation."""
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and "can't allocate memory" in str(err))


def report(cfg: TrainConfig, trainer: str, device: torch.device) -> str:
    """The predicted anatomy of this job of ``trainer`` per rank, the memory the process
    reached and the next things to try, in the decision guide's order."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    job = job_candidate(cfg, trainer, world, device.type)
    a = job.anatomy
    reached = (f"{peak_memory_bytes(device) / GIB:.2f} GiB "
               + ("allocated at peak" if device.type == "cuda" else "RSS"))
    tries = []
    if job.micro_batch > 1:
        tries.append(f"--grad-accum {cfg.grad_accum * 2} (micro-batch {job.micro_batch} -> "
                     f"{job.micro_batch // 2}, same global batch)")
    if not cfg.activation_checkpointing:
        tries.append("--activation-checkpointing")
    if cfg.dtype == "fp32":
        tries.append("--dtype bf16")
    tries.extend(TRAINERS[trainer].oom_hints)
    tries.append(f"python -m trainers.planning.plan --model {cfg.model} "
                 f"--global-batch {cfg.batch_size} --device-memory-gb <GiB> for a configuration "
                 "that fits")
    lines = [f"{TRAINERS[trainer].module}: out of memory ({reached}). Predicted per rank for "
             f"this job ({job.describe()}):",
             f"  parameters {a.params / GIB:.2f} GiB, gradients {a.grads / GIB:.2f} GiB, "
             f"optimizer state {a.optimizer / GIB:.2f} GiB, activations "
             f"{job.in_flight * a.activations / GIB:.2f} GiB, gathered {a.gathered / GIB:.2f} GiB"
             f"; peak with the runtime {job.peak_bytes / GIB:.2f} GiB",
             "Next things to try:", *(f"  - {t}" for t in tries)]
    return "\n".join(lines)


@contextlib.contextmanager
def explain_out_of_memory(cfg: TrainConfig, trainer: str,
                          device: torch.device) -> Iterator[None]:
    """Turn running out of memory inside into :func:`report` on stderr and exit status 1."""
    try:
        yield
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if not is_out_of_memory(err):
            raise
        sys.stderr.write(report(cfg, trainer, device) + "\n")
        raise SystemExit(1) from None

"""Pipeline parallelism: the model split into stages and driven by a
``torch.distributed.pipelining`` schedule, composed with tensor parallelism and FSDP2.

The spec's blocks are split into ``pp x virtual-stages`` stages (its ``first`` modules, the
embeddings, go with the first, its ``last``, the final norm and head, with the last), each rank
running ``--virtual-stages`` of them. On a (pp, dp, tp) mesh each stage is parallelized as the
2-D trainer parallelizes a whole model (:func:`trainers.parallel.parallelize.parallelize`):
tensor parallel over ``tp``, FSDP2 over ``dp``, whose reduce-scatter the schedule issues per
stage once that stage's last backward is done. A weight shared by the first and the last stage
(a tied embedding and head) is kept as a copy on each, and its gradients are summed after
backward, so the result is the single-process model's.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)
from torch.distributed.tensor import DTensor

from trainers.core.data import Batch
from trainers.core.loss import cross_entropy
from trainers.core.strategy import Strategy
from trainers.models import ModelSpec
from trainers.options.train_config import TrainConfig
from trainers.parallel.pipeline_timeline import TimedStage
from trainers.runs.storage import RunPath

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
             "interleaved1f1b": ScheduleInterleaved1F1B,
             "zerobubble": ScheduleInterleavedZeroBubble}


def stage_indices(pp_rank: int, pp: int, num_stages: int) -> list[int]:
    """The stages rank ``pp_rank`` of ``pp`` runs (loop assignment: r, r + pp, r + 2 pp, ...)."""
    return list(range(pp_rank, num_stages, pp))


def _set_module(root: nn.Module, path: str, module: nn.Module | None) -> None:
    """Set the submodule at dotted ``path`` of ``root``, creating empty parents as needed."""
    *parents, attribute = path.split(".")
    for name in parents:
        if not hasattr(root, name):
            setattr(root, name, nn.Module())
        root = getattr(root, name)
    setattr(root, attribute, module)


def split_stage(model: nn.Module, spec: ModelSpec, stage: int, num_stages: int) -> nn.Module:
    """``model`` (on the meta device) cut down to stage ``stage`` of ``num_stages``: contiguous
    blocks, the spec's ``first`` modules on the first stage and ``last`` on the last; parameter
    names unchanged."""
    blocks = spec.block_container(model)
    per_stage = len(blocks) // num_stages
    keep = {str(i) for i in range(stage * per_stage, (stage + 1) * per_stage)}
    for name in [n for n, _ in spec.named_blocks(model) if n not in keep]:
        del blocks[name]
    for names, holder in ((spec.first, 0), (spec.last, num_stages - 1)):
        if stage != holder:
            for name in names:
                _set_module(model, name, None)
    return model


def _union(parts: list[nn.Module], spec: ModelSpec) -> nn.Module:
    """One module over this rank's stages with the whole model's parameter names (their
    blocks' keys are disjoint), so checkpoints name parameters as every strategy does."""
    union = nn.Module()
    _set_module(union, spec.blocks, nn.ModuleDict(
        {k: b for part in parts for k, b in spec.named_blocks(part)}))
    for name in spec.first + spec.last:
        for part in parts:
            module = part.get_submodule(name) if _holds(part, name) else None
            if module is not None:
                _set_module(union, name, module)
    return union


def _holds(part: nn.Module, path: str) -> bool:
    """Whether ``part`` has a (not None) submodule at ``path``."""
    try:
        return part.get_submodule(path) is not None
    except AttributeError:
        return False


def _parameter(part: nn.Module, name: str) -> nn.Parameter | None:
    try:
        return part.get_parameter(name)
    except AttributeError:
        return None


class PipelineStrategy(Strategy):
    """This rank's stages of every pipeline replica, driven by one schedule per step.

    ``parts`` are this rank's stage modules, already parallelized; when they are FSDP modules
    (dp > 1) FSDP reduces their gradients and applies ``--dtype bf16`` itself."""

    def __init__(self, parts: list[nn.Module], spec: ModelSpec, indices: list[int],
                 cfg: TrainConfig, mesh: DeviceMesh, device: torch.device) -> None:
        pp_mesh, dp_mesh = mesh["pp"], mesh["dp"]
        self.pp_group = pp_mesh.get_group()
        pp_rank, pp = pp_mesh.get_local_rank(), pp_mesh.size()
        self.pp_rank = pp_rank
        num_stages = pp * cfg.virtual_stages
        self.parts = parts
        stage_class = TimedStage if cfg.record_timeline else PipelineStage
        self.stages = [stage_class(part, i, num_stages, device, group=self.pp_group)
                       for part, i in zip(self.parts, indices, strict=True)]
        self.record_timeline = cfg.record_timeline
        self.timeline: RunPath | None = None  # set by attach_run when recording
        self.steps_recorded = 0
        schedule_class = SCHEDULES[cfg.schedule]
        stages = self.stages if cfg.virtual_stages > 1 else self.stages[0]
        # Each micro-batch's loss sum is divided by the step's shared normalizer
        # (Strategy.normalizer), so the schedule must not average them again.
        self.schedule = schedule_class(stages, n_microbatches=cfg.microbatches,
                                       loss_fn=self._micro_batch_loss, scale_grads=False)
        self._normalizer = torch.ones(())
        self.last_rank = dist.get_global_rank(self.pp_group, (num_stages - 1) % pp)
        self.holds_last = (num_stages - 1) in indices
        shared = spec.shared_parameters
        self.tied_group = _tied_weight_group(mesh, num_stages - 1) if shared else None
        # This rank's copies of the weights the first and last stage share (summed after
        # backward); each counts once in the gradient norm, on the first stage.
        self.tied = [p for name in list(shared) + list(shared.values()) for part in self.parts
                     if (p := _parameter(part, name)) is not None] if pp > 1 else []
        self.tied_copies = {id(p) for name in shared if self.holds_last
                            and (p := _parameter(self.parts[-1], name)) is not None}
        self.sharded = isinstance(parts[0], FSDPModule)
        super().__init__(_union(self.parts, spec), dp_rank=dp_mesh.get_local_rank(),
                         dp_size=dp_mesh.size(), dp_group=dp_mesh.get_group())

    def autocast(self, dtype: str, device: torch.device) -> contextlib.AbstractContextManager:
        """No autocast on FSDP stages: FSDP's MixedPrecisionPolicy casts parameters for bf16."""
        return contextlib.nullcontext() if self.sharded else super().autocast(dtype, device)

    def _micro_batch_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return cross_entropy(logits, targets, self._normalizer)

    def forward_backward(self, micro_batches: Sequence[Batch], autocast) -> torch.Tensor:
        """One schedule step over the whole local batch (its micro-batches concatenated)."""
        self._normalizer = self.normalizer(micro_batches)
        inputs = torch.cat([b[0] for b in micro_batches])
        targets = torch.cat([b[1] for b in micro_batches])
        losses: list[torch.Tensor] = []
        with autocast:
            self.schedule.step(inputs, target=targets, losses=losses)
        self._sync_gradients()
        if self.timeline is not None:
            self._write_timeline()
        return self._broadcast_loss(losses, inputs.device)

    def attach_run(self, run_dir: RunPath) -> None:
        if self.record_timeline:
            self.timeline = run_dir / f"timeline.rank{dist.get_rank()}.jsonl"

    def _write_timeline(self) -> None:
        """Append this step's record of every local stage as one JSON line."""
        self.timeline.parent.mkdir(parents=True, exist_ok=True)
        self.steps_recorded += 1
        record = {"step": self.steps_recorded, "pp_rank": self.pp_rank,
                  "stages": [stage.take_record() for stage in self.stages]}
        with open(self.timeline, "a") as out:
            out.write(json.dumps(record) + "\n")

    @torch.no_grad()
    def eval_loss(self, batches: Sequence[Batch], autocast) -> torch.Tensor:
        total = torch.zeros((), device=batches[0][0].device)
        self._normalizer = self.normalizer(batches)
        self.model.eval()
        for inputs, targets in batches:
            losses: list[torch.Tensor] = []
            with autocast:
                self.schedule.eval(inputs, target=targets, losses=losses)
            total += self._broadcast_loss(losses, inputs.device)
        self.model.train()
        return total

    def _broadcast_loss(self, losses: list[torch.Tensor], device: torch.device) -> torch.Tensor:
        """The micro-batches' losses summed, from the last stage to every rank of the
        pipeline."""
        loss = (torch.stack([x.detach().float() for x in losses]).sum() if self.holds_last
                else torch.zeros((), device=device))
        dist.broadcast(loss, src=self.last_rank, group=self.pp_group)
        return loss

    def _sync_gradients(self) -> None:
        """Sum the tied embedding/head gradient over its two stages (FSDP has already averaged
        each over the replicas; the two copies are sharded alike, so their shards add up)."""
        if self.tied_group is not None:
            for weight in self.tied:
                grad = weight.grad
                dist.all_reduce(grad.to_local() if isinstance(grad, DTensor) else grad,
                                group=self.tied_group)

    def norm_grads(self) -> list[torch.Tensor]:
        return [p.grad for p in self.model.parameters()
                if p.grad is not None and id(p) not in self.tied_copies]

    def norm_group(self) -> dist.ProcessGroup | None:
        return self.pp_group


def _tied_weight_group(mesh: DeviceMesh, last_stage: int) -> dist.ProcessGroup | None:
    """Per pipeline replica, the group of the ranks holding the first and the last stage
    (None when one rank holds both). Every rank creates every group, as new_group requires."""
    pp = mesh["pp"].size()
    last = last_stage % pp
    if last == 0:
        return None
    pipelines = mesh.mesh.movedim(mesh.mesh_dim_names.index("pp"), -1).reshape(-1, pp)
    mine = None
    for ranks in pipelines.tolist():
        group = dist.new_group([ranks[0], ranks[last]])
        if dist.get_rank() in (ranks[0], ranks[last]):
            mine = group
    return mine

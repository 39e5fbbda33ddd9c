"""Pipeline parallelism: the model split into stages and driven by a
``torch.distributed.pipelining`` schedule.

The blocks are split into ``pp x virtual-stages`` stages (the embeddings go with the first, the
final norm and head with the last), each rank running ``--virtual-stages`` of them. With ``dp``
> 1 several pipelines train on shards of the batch and average their gradients. The token
embedding and the head share one weight; the first and last stage keep a copy each and sum
its gradients after backward, so the result is the single-process model's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)

from trainers.core.data import Batch
from trainers.core.model import Transformer
from trainers.core.strategy import Strategy
from trainers.parallel.pipeline_timeline import TimedStage
from trainers.spec.config import TrainConfig

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
             "interleaved1f1b": ScheduleInterleaved1F1B,
             "zerobubble": ScheduleInterleavedZeroBubble}


def stage_indices(pp_rank: int, pp: int, num_stages: int) -> list[int]:
    """The stages rank ``pp_rank`` of ``pp`` runs (loop assignment: r, r + pp, r + 2 pp, ...)."""
    return list(range(pp_rank, num_stages, pp))


def split_stage(model: Transformer, stage: int, num_stages: int) -> Transformer:
    """``model`` (on the meta device) cut down to stage ``stage`` of ``num_stages``: contiguous
    blocks, the embeddings on the first stage, norm and head on the last; names unchanged."""
    per_stage = len(model.blocks) // num_stages
    keep = {str(i) for i in range(stage * per_stage, (stage + 1) * per_stage)}
    for name in [n for n in model.blocks if n not in keep]:
        del model.blocks[name]
    if stage != 0:
        model.tok_emb = model.pos_emb = model.emb_dropout = None
    if stage != num_stages - 1:
        model.norm = model.head = None
    return model


def _union(parts: list[Transformer]) -> nn.Module:
    """One module over this rank's stages with the whole model's parameter names (their
    blocks' indices are disjoint), so checkpoints name parameters as every strategy does."""
    union = nn.Module()
    union.blocks = nn.ModuleDict({k: b for part in parts for k, b in part.blocks.items()})
    for name in ("tok_emb", "pos_emb", "norm", "head"):
        for part in parts:
            if getattr(part, name) is not None:
                setattr(union, name, getattr(part, name))
    return union


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class PipelineStrategy(Strategy):
    """This rank's stages of every pipeline replica, driven by one schedule per step."""

    def __init__(self, parts: list[Transformer], indices: list[int], cfg: TrainConfig,
                 mesh: DeviceMesh, device: torch.device) -> None:
        pp_mesh, dp_mesh = mesh["pp"], mesh["dp"]
        self.pp_group = pp_mesh.get_group()
        pp_rank, pp = pp_mesh.get_local_rank(), pp_mesh.size()
        self.pp_rank = pp_rank
        num_stages = pp * cfg.virtual_stages
        self.parts = parts
        stage_class = TimedStage if cfg.record_timeline else PipelineStage
        self.stages = [stage_class(part, i, num_stages, device, group=self.pp_group)
                       for part, i in zip(self.parts, indices, strict=True)]
        self.timeline = (Path(cfg.output_dir) / f"timeline.rank{dist.get_rank()}.jsonl"
                         if cfg.record_timeline else None)
        self.steps_recorded = 0
        schedule_class = SCHEDULES[cfg.schedule]
        stages = self.stages if cfg.virtual_stages > 1 else self.stages[0]
        self.schedule = schedule_class(stages, n_microbatches=cfg.microbatches, loss_fn=_loss)
        self.last_rank = dist.get_global_rank(self.pp_group, (num_stages - 1) % pp)
        self.holds_last = (num_stages - 1) in indices
        self.tied_group = _tied_weight_group(mesh, num_stages - 1)
        # The tied weight counts once in the gradient norm: on the stage with the embedding.
        self.tied_copy = self.parts[-1].head.weight if self.holds_last and pp > 1 else None
        super().__init__(_union(self.parts), dp_rank=dp_mesh.get_local_rank(),
                         dp_size=dp_mesh.size(), dp_group=dp_mesh.get_group())

    def forward_backward(self, micro_batches: Sequence[Batch], autocast) -> torch.Tensor:
        """One schedule step over the whole local batch (its micro-batches concatenated)."""
        inputs = torch.cat([b[0] for b in micro_batches])
        targets = torch.cat([b[1] for b in micro_batches])
        losses: list[torch.Tensor] = []
        with autocast:
            self.schedule.step(inputs, target=targets, losses=losses)
        self._sync_gradients()
        if self.timeline is not None:
            self._write_timeline()
        return self._broadcast_loss(losses, inputs.device)

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
        self.model.eval()
        for inputs, targets in batches:
            losses: list[torch.Tensor] = []
            with autocast:
                self.schedule.eval(inputs, target=targets, losses=losses)
            total += self._broadcast_loss(losses, inputs.device)
        self.model.train()
        return total / len(batches)

    def _broadcast_loss(self, losses: list[torch.Tensor], device: torch.device) -> torch.Tensor:
        """The mean micro-batch loss, from the last stage to every rank of the pipeline."""
        loss = (torch.stack([x.detach().float() for x in losses]).mean() if self.holds_last
                else torch.zeros((), device=device))
        dist.broadcast(loss, src=self.last_rank, group=self.pp_group)
        return loss

    def _sync_gradients(self) -> None:
        """Sum the tied embedding/head gradient over its two stages; average over replicas."""
        if self.tied_group is not None:
            part = self.parts[0] if self.parts[0].tok_emb is not None else self.parts[-1]
            weight = part.tok_emb.weight if part.tok_emb is not None else part.head.weight
            dist.all_reduce(weight.grad, group=self.tied_group)
        if self.dp_size > 1:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            flat = torch.cat([g.flatten() for g in grads])
            dist.all_reduce(flat, group=self.dp_group)
            flat /= self.dp_size
            offset = 0
            for grad in grads:
                grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
                offset += grad.numel()

    def norm_grads(self) -> list[torch.Tensor]:
        return [p.grad for p in self.model.parameters()
                if p.grad is not None and p is not self.tied_copy]

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

"""Fault-tolerant data parallelism across replica groups with torchft (``--fault-tolerant``).

Each replica group is a torchrun of its own, training with the trainer's strategy (DDP, or
FSDP sharding inside the group) over its own process group; :class:`ReplicaGroupStrategy`
joins the groups through torchft's ``Manager``: every step starts with a quorum at the
lighthouse (the groups alive now), the step's token count, gradients and loss are averaged
over the groups in the quorum, and the optimizer steps only if every rank of the group
commits. A group that dies restarts alone (torchrun's restarts, its role's retries) while the
others keep stepping; at its next quorum it fetches a live group's state (model, optimizer,
step, data position) and continues at that group's step. With every group alive a step is
the plain data-parallel step over all their ranks: same batches, same gradients, same loss.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor

from trainers.core.data import Batch
from trainers.core.distributed import DistEnv
from trainers.core.loss import counted_tokens
from trainers.core.strategy import Strategy
from trainers.errors import ConfigError
from trainers.options.train_config import TrainConfig
from trainers.runs.replica_groups import (
    LIGHTHOUSE_PORT,
    RunFinishedElsewhere,
    finished_groups,
    lighthouse_address,
    report_finished,
)
from trainers.runs.storage import RunPath

log = logging.getLogger(__name__)

def wait_for_lighthouse(url: str, host: str, port: int, seconds: float) -> None:
    """Return once the lighthouse at ``host:port`` accepts connections; ConfigError naming the
    fix when it does not within ``seconds`` (it may still be starting: a component starts it
    beside the groups)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((host, port), timeout=2):
                return
        except OSError as err:
            if time.monotonic() >= deadline:
                raise ConfigError(
                    f"cannot reach the torchft lighthouse at {url} within {seconds:g} s "
                    f"({err.strerror or err}); start it (torchft_lighthouse --min_replicas 1 "
                    f"--bind [::]:{LIGHTHOUSE_PORT}) or pass --lighthouse http://HOST:PORT") \
                    from None
            time.sleep(0.5)


def _local(value: Any) -> Any:
    """``value`` (a state dict) with every tensor a copy of its local part (a DTensor's shard):
    what a recovering group's rank of the same index loads."""
    if isinstance(value, DTensor):
        return value.to_local().detach().clone()
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _local(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_local(v) for v in value)
    return value


def _filled(current: Any, received: Any) -> Any:
    """``current`` (a state dict of this rank) with ``received``'s values: tensors copied in
    place into their local parts, other values taken as received."""
    if isinstance(current, DTensor):
        current.to_local().copy_(received)
        return current
    if isinstance(current, torch.Tensor):
        current.copy_(received)
        return current
    if isinstance(current, dict):
        return {k: _filled(current[k], v) if k in current else v for k, v in received.items()}
    return received


class ReplicaGroupStrategy(Strategy):
    """``inner`` (this group's strategy) joined to the other replica groups by ``manager``.

    Data-parallel rank and size span every group (``group`` of ``groups``), so each rank of
    each group reads its own shard of the global batch; the inner strategy's collectives stay
    inside the group. Gradients synchronise inside the group in backward (DDP, FSDP) and then
    across the groups in one flat all-reduce per dtype.
    """

    def __init__(self, inner: Strategy, manager: Any, group: int, groups: int,
                 store: dist.Store, lighthouse: str, steps: int, reports: bool) -> None:
        super().__init__(inner.model, dp_rank=group * inner.dp_size + inner.dp_rank,
                         dp_size=groups * inner.dp_size)
        self.inner, self.manager = inner, manager
        self._store = store  # the group's store the manager and its peers use
        self._group, self._groups = group, groups
        self._lighthouse, self._steps, self._reports = lighthouse, steps, reports
        self._step_set = False
        self._participants = 0  # in the last quorum
        self._step = self._reached = 0  # the step taken now; the last one this group holds

    def attach_run(self, run_dir: RunPath) -> None:
        self.inner.attach_run(run_dir)

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        return self.inner.no_sync()

    def autocast(self, dtype: str, device: torch.device) -> contextlib.AbstractContextManager:
        return self.inner.autocast(dtype, device)

    def loss(self, batch: Batch, normalizer: torch.Tensor) -> torch.Tensor:
        return self.inner.loss(batch, normalizer)

    def norm_grads(self) -> list[torch.Tensor]:
        return self.inner.norm_grads()

    def norm_group(self) -> dist.ProcessGroup | None:
        return self.inner.norm_group()

    def eval_loss(self, batches: Sequence[Batch],
                  autocast: contextlib.AbstractContextManager[None]) -> torch.Tensor:
        """The group's own evaluation (after the step's commit, outside its quorum)."""
        return self.inner.eval_loss(batches, autocast)

    def means_over_replicas(self, values: torch.Tensor) -> torch.Tensor:
        """Averaged over the group: a step's loss is already averaged over the groups."""
        return self.inner.means_over_replicas(values)

    def normalizer(self, batches: Sequence[Batch]) -> torch.Tensor:
        """The counted targets of the step summed over every rank of every group in the
        quorum, per replica (:meth:`Strategy.normalizer` over all of them)."""
        count = sum(counted_tokens(batch[1]) for batch in batches).to(batches[0][0].device)
        count = count.float()
        if self.inner.dp_size > 1:
            dist.all_reduce(count, group=self.inner.dp_group)
        self.manager.allreduce(count, reduce_op=dist.ReduceOp.SUM).wait()
        replicas = max(1, self.manager.num_participants()) * self.inner.dp_size
        return count.clamp_min(1) / replicas

    def forward_backward(self, micro_batches: Sequence[Batch],
                         autocast: contextlib.AbstractContextManager[None]) -> torch.Tensor:
        """The group's step (gradients synchronised inside it), then its gradients and loss
        share averaged over the groups in the quorum."""
        share = super().forward_backward(micro_batches, autocast)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        parts = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for part in parts:
            by_dtype.setdefault(part.dtype, []).append(part)
        by_dtype.setdefault(torch.float32, [])
        for dtype, tensors in by_dtype.items():
            extra = [share.reshape(1).float()] if dtype == torch.float32 else []
            flat = torch.cat([t.reshape(-1) for t in tensors] + extra)
            self.manager.allreduce(flat).wait()
            offset = 0
            for t in tensors:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
            if extra:
                share = flat[-1].to(share.dtype)
        return share

    def begin_step(self, step: int) -> int:
        """Start step ``step``'s quorum (healing from a live group if this one is behind) and
        return the step this group takes now: ``step``, or the live groups' next one."""
        if not self._step_set:  # a fresh or resumed run starts at the step it reached
            self.manager.load_state_dict({"step": step - 1, "batches_committed": 0})
            self._step_set = True
        self.manager.start_quorum()
        participants = self.manager.num_participants()
        if participants != self._participants and participants < self._groups:
            self._stop_if_finished_elsewhere()
        self._participants = participants
        taken = self.manager.current_step() + 1
        if taken != step:
            log.info("replica group %d healed from a live group: at step %d, not %d",
                     self._group, taken, step)
        self._step, self._reached = taken, taken - 1
        return taken

    def _stop_if_finished_elsewhere(self) -> None:
        """RunFinishedElsewhere (every rank of the group) where another group reported having
        trained the last step: a quorum without it is this group training the run again alone
        (the lighthouse leaves a group out once it stopped heartbeating, after its report)."""
        finished = [finished_groups(self._lighthouse) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(finished, src=0)
        if finished[0]:
            raise RunFinishedElsewhere(self._group, finished[0], self._steps)

    def commit(self) -> bool:
        """Whether every rank of the group finished the step with enough groups alive: the
        optimizer steps only then, else the step is taken again."""
        committed = self.manager.should_commit()
        if committed:
            self._reached = self._step
        return committed

    def share_state(self, state: dict[str, Stateful]) -> None:
        """``state`` (what a checkpoint holds) is what a recovering group fetches from a live
        one: each rank the local parts of the same-index rank's state."""
        def saved() -> dict[str, Any]:
            return {name: _local(item.state_dict()) for name, item in state.items()}

        def load(received: dict[str, Any]) -> None:
            for name, item in state.items():
                item.load_state_dict(_filled(item.state_dict(), received[name]))

        self.manager.register_state_dict_fn("run", load, saved)

    def close(self) -> None:
        """Leave the quorum; a group that holds the last step (its final checkpoint and summary
        written: the loop closes the strategy last) first tells the lighthouse, while it still
        heartbeats, so no group left alone after it trains the run again."""
        if self._reports and self._reached >= self._steps:
            report_finished(self._lighthouse, self._group, self._steps)
        self.manager.shutdown(wait=False)


def group_store(env: DistEnv) -> tuple[dist.Store, str, int]:
    """A store for this attempt of the group, hosted by its rank 0 on a free port: torchft's
    manager publishes its address there, and the other groups reach this group's ranks
    through it (a store kept across torchrun's restarts would hand the restarted ranks the
    dead manager's address). Returns the store, its host and port (every rank)."""
    where: list[Any] = [None]
    store = None
    if env.rank == 0:  # the server listens on every interface; peers use the host's name
        store = dist.TCPStore(socket.gethostname(), 0, is_master=True, wait_for_workers=False)
        where = [(socket.gethostname(), store.port)]
    dist.broadcast_object_list(where, src=0)
    host, port = where[0]
    if store is None:
        store = dist.TCPStore(host, port, is_master=False, wait_for_workers=False)
    return store, host, port


def join_replica_groups(cfg: TrainConfig, env: DistEnv, inner: Strategy) -> ReplicaGroupStrategy:
    """``inner`` as replica group ``--replica-group`` of ``--replica-groups``, its quorum held
    by the lighthouse of ``--lighthouse`` (waited for up to ``--quorum-timeout`` seconds).
    RunFinishedElsewhere (on every rank of the group) where another group already told the
    lighthouse it trained the last step."""
    from torchft import Manager
    from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

    url, host, port = lighthouse_address(cfg.lighthouse)
    wait_for_lighthouse(url, host, port, cfg.quorum_timeout)
    finished = [finished_groups(url) if env.rank == 0 else None]
    dist.broadcast_object_list(finished, src=0)  # the group's ranks decide as one
    if finished[0]:
        raise RunFinishedElsewhere(cfg.replica_group, finished[0], cfg.steps)
    timeout = timedelta(seconds=cfg.quorum_timeout)
    store, store_host, store_port = group_store(env)
    pg = (ProcessGroupNCCL(timeout=timeout) if env.backend == "nccl"
          else ProcessGroupGloo(timeout=timeout))
    manager = Manager(pg=pg, load_state_dict=None, state_dict=None,
                      min_replica_size=cfg.min_replicas, use_async_quorum=False,
                      timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout,
                      rank=env.rank, world_size=env.world_size, store_addr=store_host,
                      store_port=store_port, lighthouse_addr=url,
                      replica_id=f"replica_group_{cfg.replica_group}", init_sync=False)
    return ReplicaGroupStrategy(inner, manager, cfg.replica_group, cfg.replica_groups, store,
                                url, cfg.steps, reports=env.rank == 0)

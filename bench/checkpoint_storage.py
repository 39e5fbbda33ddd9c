"""Checkpoint save and resume on local disk against an S3 server, and the stall of an
asynchronous save to each (docs/benchmarks.md, "Checkpoint storage: local disk against S3").

One process (``--worker``; world size 1, gloo) saves and resumes a model, its AdamW state, the
step and its RNG through :class:`trainers.core.checkpoint.Checkpointer` into a directory on the
local disk and into ``s3://`` on moto's S3 server, which this benchmark's own process serves on
127.0.0.1 (``ThreadedMotoServer``): HTTP between two processes, as from a trainer to a bucket.
"""

import contextlib
import json
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy
import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F

from bench import harness
from bench.harness import THREADS, median
from trainers.config.parsing import parse_config
from trainers.core import checkpoint_storage
from trainers.core.checkpoint import Checkpointer
from trainers.core.checkpoint_state import ModelAndOptimizer, Progress, RankRNG
from trainers.core.distributed import init_distributed
from trainers.models import build_model
from trainers.runs.checkpoint_files import MANIFEST
from trainers.runs.storage import RunPath, location
from trainers.sizing.shapes import MODEL_SIZES

TARGETS = ("disk", "s3")
REGION = "us-east-1"
OVERRIDES = {"rounds": 1, "micro_batch": 1}
QUICK = {"model": "tiny", "rounds": 1, "timeout_s": 180.0}
# Where a save's and a resume's time goes: the Checkpointer's calls, wrapped by name
PHASES = {"prepare": (checkpoint_storage, "prepare"),
          "rank_state": (checkpoint_storage, "write_rank_state"), "write": (dcp, "save"),
          "commit": (checkpoint_storage, "commit"), "prune": (checkpoint_storage, "prune"),
          "load": (dcp, "load"), "os_sync": (os, "sync")}  # DCP's for a stream without fileno


@dataclass
class Plan:
    model: str = "small"
    micro_batch: int = 8  # sequences of the training step between an async save and its commit
    rounds: int = 5  # each round saves, resumes and async-saves once per target, order rotating
    keep: int = 2  # --keep-checkpoints
    timeout_s: float = 1800.0


class Clock:
    """Seconds spent in each of :data:`PHASES` since the last :meth:`take`, on any thread."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        for label, (owner, name) in PHASES.items():
            setattr(owner, name, self._timed(label, getattr(owner, name)))

    def _timed(self, label: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.spent[label] = self.spent.get(label, 0.0) + time.perf_counter() - start
        return timed

    def take(self) -> dict[str, float]:
        spent, self.spent = self.spent, {}
        return spent


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               batch: tuple[torch.Tensor, torch.Tensor]) -> float:
    """One optimizer step on ``batch``; its seconds."""
    start = time.perf_counter()
    inputs, targets = batch
    loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return time.perf_counter() - start


def checkpoint_bytes(checkpoint: RunPath) -> int:
    """Bytes in committed ``checkpoint``: its files (as its manifest lists them) and manifest."""
    text = (checkpoint / MANIFEST).read_text()
    return sum(size for size, _ in json.loads(text)["files"].values()) + len(text.encode())


def cpu_s() -> float:
    """This process's CPU seconds so far (every thread's)."""
    usage = os.times()
    return usage.user + usage.system


def one_round(ckpt: Checkpointer, progress: Progress, clock: Clock, step: int,
              train: Callable[[], float]) -> dict[str, Any]:
    """Checkpoint ``step`` saved synchronously, then resumed (``--resume auto``); then
    ``step + 1`` saved asynchronously with a training step before its commit, as the loop does.
    ``<name>_s`` is this process's wall time in the call, ``<name>_at`` its start and end
    (``perf_counter``, the same clock in every process), ``<name>_cpu_s`` its CPU time (in the
    sync save and the resume: what is not is waiting, for the disk or the server). The resume
    is find and load; the async stall is held at the save and at the commit; the async cost
    adds how much longer the training step ran with the write in the background."""
    out: dict[str, Any] = {}

    def timed(name: str, call: Callable[[], Any]) -> Any:
        cpu, start = cpu_s(), time.perf_counter()
        value = call()
        end = time.perf_counter()
        out.update({f"{name}_s": end - start, f"{name}_at": [start, end],
                    f"{name}_cpu_s": cpu_s() - cpu, f"{name}_phases": clock.take()})
        return value

    progress.step = step
    clock.take()
    saved = timed("save", lambda: ckpt.save(step))
    chosen = timed("find", lambda: ckpt.choose("auto"))
    if chosen != saved:
        raise harness.BenchError(f"resume chose {chosen}, not the checkpoint just saved, {saved}")
    timed("load", lambda: ckpt.load(chosen))
    out["step_alone_s"] = train()
    progress.step = step + 1
    timed("held_save", lambda: ckpt.save(step + 1, asynchronous=True))
    out["step_with_write_s"] = train()
    timed("held_commit", ckpt.commit_pending)
    ckpt._background.submit(int).result()  # the background prune ends before the next figure
    stall = out["held_save_s"] + out["held_commit_s"]
    return {**out, "bytes": checkpoint_bytes(saved), "async_phases": clock.take(),
            "resume_s": out["find_s"] + out["load_s"], "resume_at": [out["find_at"][0],
                                                                     out["load_at"][1]],
            "resume_cpu_s": out["find_cpu_s"] + out["load_cpu_s"], "stall_s": stall,
            "async_cost_s": stall + out["step_with_write_s"] - out["step_alone_s"]}


def worker(prefix: str, argv: Sequence[str]) -> None:
    """``--worker PREFIX PLAN_JSON DISK_DIR S3_URL``: the plan's rounds, plus one unmeasured
    warm-up round per target (DCP's planning caches, the async save's process group and staging
    buffers, the S3 client's connections); the record of every round."""
    plan, roots = Plan(**json.loads(argv[0])), dict(zip(TARGETS, argv[1:], strict=True))
    torch.set_num_threads(THREADS)
    cfg = parse_config(["--device", "cpu", "--model", plan.model], "ddp", check_paths=False)
    shape, model = MODEL_SIZES[plan.model], build_model(plan.model, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, shape.vocab_size, (plan.micro_batch, shape.max_seq_len + 1),
                           generator=torch.Generator().manual_seed(0))
    batch = (tokens[:, :-1], tokens[:, 1:])
    train = lambda: train_step(model, optimizer, batch)  # noqa: E731
    train()  # AdamW's state exists from here on, as in any checkpoint after step 1
    clock, rounds = Clock(), []
    with init_distributed(cfg) as env:
        progress = Progress()
        ckpts = {target: Checkpointer(location(root), plan.keep, env, cfg.to_dict(),
                                      state={"train": ModelAndOptimizer(model, optimizer),
                                             "progress": progress},
                                      rank_state={"rng": RankRNG()})
                 for target, root in roots.items()}
        try:
            for target in TARGETS:
                one_round(ckpts[target], progress, clock, 1, train)
            for r, target in harness.rotations(TARGETS, plan.rounds):
                harness.progress(f"round {r}: {target}")
                record = one_round(ckpts[target], progress, clock, 1 + 2 * r, train)
                rounds.append({"round": r, "target": target, "root": roots[target], **record})
        finally:
            for ckpt in ckpts.values():
                ckpt.close()
    harness.write_rank(prefix, {"rounds": rounds, "parameters": sum(
        p.numel() for p in model.parameters()), "seq_len": shape.max_seq_len})


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """A bucket on moto's S3 server, running in this process on 127.0.0.1; its URL. This
    process's environment (and so the worker's) points at it, as ``AWS_*`` does for a user."""
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError as err:
        raise harness.BenchError(f"{err.name} is missing: pip install -e '.[dev]'") from None
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        os.environ.update({"AWS_ENDPOINT_URL": f"http://{host}:{port}",
                           "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                           "AWS_DEFAULT_REGION": REGION})
        boto3.client("s3", region_name=REGION).create_bucket(Bucket="bench")
        yield "s3://bench/run"
    finally:
        server.stop()


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": median(values), "min": min(values), "max": max(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else 0.0}


TIMES = ("save_s", "save_cpu_s", "server_save_cpu_s", "find_s", "load_s", "resume_s",
         "resume_cpu_s", "server_resume_cpu_s", "held_save_s", "held_commit_s", "stall_s",
         "async_cost_s", "step_alone_s", "step_with_write_s")


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per target, over its rounds: every time's median and spread, the phases' medians, the
    bytes and the rates; then S3 over disk."""
    out: dict[str, Any] = {}
    for target in TARGETS:
        mine = [r for r in rounds if r["target"] == target]
        row: dict[str, Any] = {key: spread([r[key] for r in mine]) for key in TIMES}
        row["bytes"] = size = median([r["bytes"] for r in mine])
        row["save_mib_s"] = size / 2**20 / row["save_s"]["median"]
        row["resume_mib_s"] = size / 2**20 / row["resume_s"]["median"]
        row["stall_over_save"] = row["stall_s"]["median"] / row["save_s"]["median"]
        row["async_cost_over_save"] = row["async_cost_s"]["median"] / row["save_s"]["median"]
        row["phases"] = {kind: {phase: median([r[kind].get(phase, 0.0) for r in mine])
                                for phase in PHASES}
                         for kind in ("save_phases", "load_phases", "held_save_phases",
                                      "async_phases")}
        out[target] = row
    ratios = {key: out["s3"][key]["median"] / out["disk"][key]["median"]
              for key in ("save_s", "resume_s", "stall_s", "async_cost_s")}
    return {"targets": out, "s3_over_disk": ratios}


@contextlib.contextmanager
def cpu_samples(every_s: float = 0.01) -> Iterator[list[tuple[float, float]]]:
    """``(perf_counter, cpu_s())`` of this process every ``every_s`` while the block runs."""
    samples: list[tuple[float, float]] = [(time.perf_counter(), cpu_s())]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(every_s):
            samples.append((time.perf_counter(), cpu_s()))
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()


def run(plan: Plan, scratch: Path) -> dict[str, Any]:
    with s3_server() as url, cpu_samples() as samples:
        # this process now only serves S3 (and reads the worker's log)
        result = harness.run_ranks("bench.checkpoint_storage",
                                   [json.dumps(asdict(plan)), str(scratch / "disk-run"), url], 1,
                                   scratch, "checkpoints", plan.timeout_s)
    record = result["ranks"][0]
    times, cpu = zip(*samples, strict=True)
    for r in record["rounds"]:  # the server's CPU time during the save and during the resume
        for name in ("save", "resume"):
            r[f"server_{name}_cpu_s"] = float(numpy.diff(numpy.interp(r[f"{name}_at"], times,
                                                                      cpu))[0])
    return {"command_worker": result["command"], "world_size": 1, "backend": "gloo",
            "versions": {name: version(name) for name in ("moto", "s3fs", "fsspec", "boto3")},
            "parameters": record["parameters"], "seq_len": record["seq_len"],
            "server_cpu_s": cpu[-1] - cpu[0], "load_avg_at_end": list(os.getloadavg()),
            "rounds": record["rounds"], "summary": summarize(record["rounds"])}


def table(report: dict[str, Any]) -> str:
    def ms(value: float) -> str:
        return f"{value * 1e3:,.0f} ms"

    def spread_ms(times: dict[str, float]) -> str:
        return f"{ms(times['median'])} ({times['min'] * 1e3:,.0f}-{times['max'] * 1e3:,.0f})"

    summary, ratios = report["summary"]["targets"], report["summary"]["s3_over_disk"]
    rows = [("target", "checkpoint", "sync save", "MiB/s", "resume", "MiB/s",
             "async: held at save", "held at commit", "stall / save", "async cost / save")]
    phases = [("target", "save: prepare", "DCP write", "os.sync", "commit", "prune", "CPU",
               "server CPU", "resume: find", "DCP load", "CPU", "server CPU",
               "held at save: prepare", "step alone", "step with async write")]
    for target, row in summary.items():
        rows.append((target, harness.human(row["bytes"]), spread_ms(row["save_s"]),
                     f"{row['save_mib_s']:.0f}", spread_ms(row["resume_s"]),
                     f"{row['resume_mib_s']:.0f}", spread_ms(row["held_save_s"]),
                     spread_ms(row["held_commit_s"]), f"{row['stall_over_save']:.2f}",
                     f"{row['async_cost_over_save']:.2f}"))
        save, held = row["phases"]["save_phases"], row["phases"]["held_save_phases"]
        mid = {key: row[key]["median"] for key in TIMES}
        phases.append((target, *map(ms, (
            save["prepare"] + save["rank_state"], save["write"], save["os_sync"], save["commit"],
            save["prune"], mid["save_cpu_s"], mid["server_save_cpu_s"], mid["find_s"],
            row["phases"]["load_phases"]["load"], mid["resume_cpu_s"], mid["server_resume_cpu_s"],
            held["prepare"] + held["rank_state"], mid["step_alone_s"],
            mid["step_with_write_s"]))))
    return (f"{report['plan']['model']} ({report['parameters'] / 1e6:.1f}M parameters), one "
            f"process (gloo), medians of {report['plan']['rounds']} rounds (min-max)\n"
            + harness.columns(rows) + "\n\nmedians of the phases (prepare: emptying step_<N> "
            "and the rank's RNG file)\n" + harness.columns(phases)
            + f"\n\nS3 / disk: sync save {ratios['save_s']:.2f}, resume {ratios['resume_s']:.2f}, "
            f"async stall {ratios['stall_s']:.2f}, async cost {ratios['async_cost_s']:.2f}; "
            f"the S3 server's process: {report['server_cpu_s']:.1f} CPU-seconds in all")


if __name__ == "__main__":
    raise SystemExit(harness.main())

"""Will scaling pay: ``python -m trainers.scaling --trainer ddp --nproc 2 -- TRAINER ARGS``.

Runs the trainer on your model and data briefly at 1 process and at ``--nproc`` processes
(``--nodes N`` adds N nodes x ``--nproc``: the ``scaling`` component's ``-j NxG``) and reports
tokens/s, the scaling efficiency (tokens/s per device over the 1-process run's, every
data-parallel replica keeping the batch it has in the largest run), and each step split into
compute, exposed communication, data wait and host overhead (the trainers' ``--profile-steps``:
torch.profiler over the last steps). It names the pitfalls it sees with their fix: data
loading, a batch per device too small for the communication, duplicated samples across ranks,
tensor parallel across nodes, sub-linear scaling and its cause. The table, ``scaling.json``
and the figure ``scaling.png`` go into ``--output-dir``, one run directory per size beside them
(with its log, ``profile.json`` and ``profile-trace.json``).

``--batch-size`` (and the trainer's other options, after ``--``) describe the largest run; the
smaller runs keep its batch per data-parallel replica. The 1-process run has no tensor or
pipeline parallelism. On CPUs every process gets ``OMP_NUM_THREADS`` threads (1 unless set),
so a process is one "device" at every size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import torch

from trainers.config.parsing import exit_on_config_error, split_at_dashes
from trainers.core.batch_stream import BatchStream
from trainers.core.data import build_datasets
from trainers.core.distributed import DistEnv
from trainers.core.profiling import PROFILE_FILE
from trainers.errors import ConfigError
from trainers.options.train_config import TrainConfig
from trainers.runs.log_setup import configure_logging
from trainers.runs.run_plot import load_run
from trainers.runs.storage import location, remove, write_bytes_atomic
from trainers.scaling.plot import render
from trainers.scaling.report import Facts, Phase, pitfalls, table
from trainers.scaling.runs import (
    PROG,
    WARMUP_STEPS,
    Options,
    Size,
    build_parser,
    check_options,
    check_runs,
)
from trainers.sizing.step_breakdown import breakdown_of

# How long node 0 waits for a multi-node run's rank 0, which may sit on another node, to
# write its profile once its own processes ended.
RESULT_WAIT_S = 300.0


def launch_command(opts: Options, size: Size, args: Sequence[str]) -> list[str]:
    """torchrun for ``size``: standalone on one node, else a c10d rendezvous at
    ``--rdzv-endpoint`` shared by the nodes."""
    module = f"trainers.{opts.trainer}"
    if size.nodes == 1:
        where = ["--standalone", "--nnodes", "1"]
    else:
        where = ["--nnodes", str(size.nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                 opts.rdzv_endpoint, "--rdzv-id", f"{opts.run_id}-{size.dirname}"]
    return [sys.executable, "-m", "torch.distributed.run", *where, "--nproc-per-node",
            str(size.nproc), "-m", module, *args]


def launch(opts: Options, size: Size, args: Sequence[str], cpu: bool) -> None:
    """Run ``size``; this node's output goes to ``<run>/launch-node<rank>.log``. ConfigError
    when it fails, after printing the log's last lines."""
    command = launch_command(opts, size, args)
    env = dict(os.environ)
    if cpu:
        env.setdefault("OMP_NUM_THREADS", "1")
    print(f"{PROG}: {size.name}: {' '.join(command[1:])}", flush=True)
    log = location(opts.output_dir) / size.dirname / f"launch-node{opts.node_rank}.log"
    with tempfile.TemporaryFile() as output:
        status = subprocess.run(command, env=env, stdout=output,
                                stderr=subprocess.STDOUT).returncode
        output.seek(0)
        text = output.read()
    write_bytes_atomic(log, text)
    if status:
        tail = text.decode(errors="replace").strip().splitlines()[-15:]
        print("\n".join(tail), file=sys.stderr)
        raise ConfigError(f"the {size.name} run failed (exit {status}); its log is {log} "
                          "(the last lines above)")


def read_phase(opts: Options, size: Size, tokens_per_replica: int, wait_s: float) -> Phase:
    """``size``'s tokens/s (the trainer's step timers over the steps between the warm-up and
    the profiler's) and mean breakdown (its ``profile.json``), waiting up to ``wait_s`` for
    them (a multi-node run's rank 0 may be on another node)."""
    run_dir = location(opts.output_dir) / size.dirname
    profile_file = run_dir / PROFILE_FILE
    deadline = time.monotonic() + wait_s
    while not profile_file.is_file():
        if time.monotonic() > deadline:
            raise ConfigError(f"the {size.name} run wrote no {profile_file}; see the "
                              f"launch logs in {run_dir}")
        time.sleep(1.0)
    profile = json.loads(profile_file.read_text())
    first_profiled = profile["steps"][0]
    timed = [m for m in load_run(run_dir).metrics
             if WARMUP_STEPS < m["step"] < first_profiled - 1]
    seconds = sum(m["step_time_s"] for m in timed)
    tokens = sum(m["tokens_per_s"] * m["step_time_s"] for m in timed)
    return Phase(size.name, size.nodes, size.nproc, tokens / seconds,
                 breakdown_of(profile["mean"]), tokens_per_replica)


def clear_earlier(opts: Options, runs: Sequence[Size]) -> None:
    """Remove an earlier measurement's run directories (node 0, before anything runs), so
    that no figure of it is read as this one's; ConfigError when such a directory exists but
    no measurement wrote it (it holds no ``launch-node*.log``)."""
    for size in runs:
        run_dir = location(opts.output_dir) / size.dirname
        if not run_dir.exists():
            continue
        if not any(p.name.startswith("launch-node") for p in run_dir.iterdir()):
            raise ConfigError(f"{run_dir} exists and holds no {PROG} run; pass another "
                              "--output-dir")
        remove(run_dir)


def duplicated_sequences(cfg: TrainConfig, dp_size: int) -> tuple[int, int]:
    """How many of the sequences the ``dp_size`` replicas read in the first step repeat
    another's, of how many: the trainers' own data stream (:class:`BatchStream`), built
    here for each replica."""
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"),
                  backend="gloo")
    train_set, _ = build_datasets(cfg, env)
    micro = cfg.micro_batch(dp_size)
    digests = []
    for rank in range(dp_size):
        stream = BatchStream(train_set, micro, rank, dp_size, cfg.seed,
                             global_batch=cfg.batch_size)
        for _ in range(cfg.grad_accum):
            tokens = next(stream)[0]
            digests += [hashlib.sha1(row.numpy().tobytes()).hexdigest() for row in tokens]
    return len(digests) - len(set(digests)), len(digests)


def report(opts: Options, cfg: TrainConfig, phases: Sequence[Phase]) -> dict:
    """Print the table and the pitfalls; write ``scaling.json`` and ``scaling.png``."""
    largest = max(phases, key=lambda p: p.devices)
    duplicated, sampled = duplicated_sequences(cfg, cfg.dp_size(largest.devices))
    facts = Facts(opts.trainer, cfg.num_workers, cfg.tp, cfg.grad_accum, duplicated, sampled)
    found = pitfalls(phases, facts)
    out = location(opts.output_dir)
    result = {"trainer": opts.trainer, "phases": [p.to_dict(phases[0]) for p in phases],
              "pitfalls": [dataclasses.asdict(p) for p in found],
              "duplicated_sequences": duplicated, "sampled_sequences": sampled}
    write_bytes_atomic(out / "scaling.json", json.dumps(result, indent=1).encode())
    print(table(phases))
    print("pitfalls:" if found else "pitfalls: none seen")
    for pitfall in found:
        print(f"- {pitfall.kind}: {pitfall.message}")
    try:
        image = render(phases)
    except ImportError:
        print(f"{PROG}: matplotlib is not installed, so no scaling.png "
              "(pip install -e '.[plot]')")
    else:
        write_bytes_atomic(out / "scaling.png", image)
    print(f"{PROG}: wrote {out / 'scaling.json'} and {out / 'scaling.png'}")
    return result


def parse(argv: Sequence[str]) -> tuple[Options, list[str]]:
    """The measurement's options (before ``--``) and the trainer's arguments (after)."""
    own, trainer_args = split_at_dashes(argv)
    opts = Options(**vars(build_parser(__doc__.split("\n\n")[1]).parse_args(own)))
    if opts.nproc == 0:
        opts = dataclasses.replace(opts, nproc=torch.cuda.device_count() or 2)
    check_options(opts)
    return opts, trainer_args


def main(argv: Sequence[str] | None = None) -> dict | None:
    """Measure; return what ``scaling.json`` holds (None on a node other than 0)."""
    configure_logging()
    with exit_on_config_error(PROG):
        opts, trainer_args = parse(sys.argv[1:] if argv is None else argv)
        cfg, runs = check_runs(opts, trainer_args)
        cpu = cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())
        largest = max(runs, key=lambda s: s.world)
        per_replica = cfg.batch_size // cfg.dp_size(largest.world) * cfg.seq_len
        if opts.node_rank == 0:
            clear_earlier(opts, list(runs))
        phases = {}
        for size, args in runs.items():
            if opts.node_rank != 0 and size.nodes == 1:
                continue
            launch(opts, size, args, cpu)
            if opts.node_rank == 0:
                wait = RESULT_WAIT_S if size.nodes > 1 else 0.0
                phases[size] = read_phase(opts, size, per_replica, wait)
        if opts.node_rank != 0:
            return None
        ordered = [phases[s] for s in sorted(phases, key=lambda s: (s.world, s.nodes))]
        return report(opts, cfg, ordered)


def cli() -> None:
    """The ``ttx-scaling`` console script: :func:`main` (a console script exits with what its
    function returns)."""
    main()


"""The Ray Train launcher (``trainers.on_ray.train``) in this process: its arguments and their
one-line refusals, the address probe and the placement check on a cluster's node table
(``trainers.on_ray.cluster``), the workers' attempt count (``trainers.on_ray.worker``), and the
loop's hooks that the launcher's workers use. The runs on a real Ray cluster are
tests/system/test_ray.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from tests.support.runs import TINY, losses, without
from trainers.config.parsing import parse_config
from trainers.core.distributed import init_distributed
from trainers.errors import ConfigError
from trainers.on_ray.cluster import check_address, check_resources, placeable_workers
from trainers.on_ray.train import parse_args
from trainers.on_ray.worker import Attempts

# The trainer arguments of the launcher cases, and of the runs of tests/system/test_ray.py: 10
# steps with checkpoints at 4 and 8 (and 10), so a kill at step 6 loses 2 steps.
ARGS = [*without(TINY, "--steps", "--resume", "--batch-size"), "--batch-size", "16",
        "--steps", "10", "--checkpoint-every", "4", "--resume", "auto"]


@pytest.mark.parametrize("launcher, message", [
    (["--trainer", "model_parallel", "--workers", "2"],
     "--trainer model_parallel cannot run under Ray Train: it spreads one process's blocks over "
     "several devices, while Ray Train runs one process per device; run it with `torchx run "
     "components/model_parallel.py:model_parallel`"),
    (["--trainer", "zero", "--workers", "2"],
     "--trainer zero is not a trainer; pass ddp or fsdp or tensor_parallel or pipeline"),
    (["--trainer", "ddp", "--workers", "0"], "--workers must be positive, got 0"),
    (["--trainer", "ddp", "--workers", "2", "--max-failures", "-2"], "--max-failures must be -1"),
    (["--trainer", "ddp", "--workers", "2", "--report-every", "-1"],
     "--report-every must be >= 0, got -1"),
    (["--trainer", "ddp", "--workers", "2", "--address", "auto", "--num-cpus", "2"],
     "--num-cpus sizes the local cluster"),
    (["--trainer", "ddp", "--workers", "2", "--address", "nohost"],
     "--address nohost: expected HOST:PORT"),
    (["--trainer", "ddp", "--workers", "3"],
     "--batch-size 16 is not divisible by --grad-accum 1 x data-parallel size 3"),
    (["--trainer", "ddp", "--workers", "2", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_launcher_input_is_one_line(tmp_path, launcher, message):
    """Refused before Ray is contacted."""
    with pytest.raises(ConfigError) as err:
        parse_args([*launcher, "--", *ARGS, "--output-dir", str(tmp_path)])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_address_probe_tells_a_grpc_server_from_another_service(tmp_path):
    """A gRPC server (as Ray's GCS is) passes; an HTTP server (say, the dashboard's port) and a
    closed port are refused in one line, in well under the probe's timeout."""
    import http.server
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    grpc_server = grpc.server(ThreadPoolExecutor(1))
    grpc_port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    http_server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=http_server.serve_forever, daemon=True).start()
    try:
        check_address(f"127.0.0.1:{grpc_port}")
        start = time.monotonic()
        with pytest.raises(ConfigError, match="the service there is not a Ray cluster"):
            check_address(f"127.0.0.1:{http_server.server_port}")
        assert time.monotonic() - start < 4
    finally:
        grpc_server.stop(None)
        http_server.shutdown()
        http_server.server_close()
    with pytest.raises(ConfigError, match=r"no Ray cluster answers there \(Connection refused\)"):
        check_address(f"127.0.0.1:{http_server.server_port}")


def test_attempts_count_the_worker_groups():
    attempts = Attempts()
    assert [attempts.start() for _ in range(3)] == [0, 1, 2]


def test_trainer_arguments_are_parsed_for_the_workers(tmp_path):
    options, cfg, argv = parse_args(["--trainer", "fsdp", "--workers", "2", "--",
                                     *ARGS, "--output-dir", "relative/run"])
    assert (options.trainer, options.workers, cfg.batch_size) == ("fsdp", 2, 16)
    assert Path(cfg.output_dir).is_absolute() and argv[-2:] == ["--output-dir", cfg.output_dir]


def node(cpus: float, gpus: float = 0, alive: bool = True) -> dict:
    return {"Alive": alive, "Resources": {"CPU": cpus, "GPU": gpus} if gpus else {"CPU": cpus}}


@pytest.mark.parametrize("nodes, cpus, gpus, expected", [
    ([node(2)], 1, 0, 2),
    ([node(2), node(2)], 1.5, 0, 2),  # 1.5 CPUs fit once per 2-CPU node, not 4 / 1.5 times
    ([node(8, 2), node(8, 2)], 1, 1, 4),  # GPUs bound it
    ([node(8)], 1, 1, 0),
    ([node(4), node(4, alive=False)], 1, 0, 4),  # dead nodes hold nothing
])
def test_placeable_workers(nodes, cpus, gpus, expected):
    assert placeable_workers(nodes, cpus, gpus) == expected


def test_check_resources_passes_when_the_workers_fit(tmp_path):
    options, _, _ = parse_args(["--trainer", "ddp", "--workers", "4", "--", *ARGS,
                                "--output-dir", str(tmp_path)])
    fit = (options.workers, options.cpus_per_worker, options.gpus_per_worker)
    check_resources(*fit, [node(2), node(2)])
    with pytest.raises(ConfigError, match="2 nodes, 3 CPUs, 0 GPUs"):
        check_resources(*fit, [node(2), node(1)])


def test_init_distributed_joins_a_group_it_did_not_form():
    """A launcher's group (here a world of one) is used as it is and left initialised."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with init_distributed(parse_config(["--device", "cpu"], "ddp")) as env:
            assert (env.rank, env.world_size, env.backend, env.device.type) == (0, 1, "gloo",
                                                                                 "cpu")
        assert dist.is_initialized()
        with pytest.raises(ConfigError, match="the launcher's process group uses gloo"), \
                init_distributed(parse_config(["--backend", "nccl"], "ddp")):
            pass
    finally:
        dist.destroy_process_group()


def test_step_hook_sees_every_step_and_the_committed_checkpoints(tmp_path):
    """The loop's on_step hook gets each step's metrics and a checkpoint's directory once it
    is committed: a periodic (asynchronous) one after the next step, the final one at once."""
    from trainers.core.loop import train
    from trainers.ddp import build
    from trainers.models import spec_of

    cfg = parse_config([*without(TINY, "--steps"), "--steps", "5", "--checkpoint-every", "2",
                        "--device", "cpu", "--output-dir", str(tmp_path)], "ddp")
    seen: list[tuple[int, float, Path | None]] = []
    spec = spec_of(cfg)
    with init_distributed(cfg) as env:
        train(cfg, env, build(cfg, env, spec), spec, tmp_path,
              on_step=lambda s, m, c: seen.append((s, m["loss"], c)))
    assert [s for s, _, _ in seen] == [1, 2, 3, 4, 5]
    assert {s: loss for s, loss, _ in seen} == losses(tmp_path)
    ckpts = tmp_path / "checkpoints"
    assert [c for _, _, c in seen] == [None, None, ckpts / "step_00000002", None,
                                       ckpts / "step_00000005"]

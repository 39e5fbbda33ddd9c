"""The ``tune`` component: a hyperparameter search (``python -m trainers.tune``) as one job.

``torchx run components/tune.py:tune --trainer ddp --search "lr=loguniform:1e-4:1e-2" --trials 8
--cpu 8 -- --model small --steps 400``
"""

from typing import Dict, List, Optional

from torchx import specs

from components.errors import ComponentArgumentError
from components.launch import DEFAULT_IMAGE, node_resource, with_output_dir
from trainers.config.parsing import parse_config
from trainers.errors import ConfigError
from trainers.options import trainer_table
from trainers.tune.search_space import SearchOptions, check_search


def _search_args(trainer: str, search: str, workers: int, trials: int, max_concurrent: int,
                seed: int, num_cpus: int, gpus: int) -> list[str]:
    """``trainers.tune``'s own options for a search on one node of ``num_cpus`` CPUs and
    ``gpus`` GPUs (one per worker when there are GPUs)."""
    args = ["--trainer", trainer, "--workers", str(workers), "--trials", str(trials),
            "--max-concurrent", str(max_concurrent), "--num-cpus", str(num_cpus)]
    for expr in search.split():
        args += ["--search", expr]
    if seed >= 0:
        args += ["--seed", str(seed)]
    if gpus:
        args += ["--gpus-per-worker", "1"]
    return args


def tune(
    *script_args: str,
    trainer: str,
    search: str,
    workers: int = 1,
    trials: int = 4,
    max_concurrent: int = 0,
    seed: int = -1,
    image: str = DEFAULT_IMAGE,
    cpu: int = 0,
    gpu: int = 0,
    memMB: int = 0,
    h: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    mounts: Optional[List[str]] = None,
) -> specs.AppDef:
    """A hyperparameter search on Ray Tune (``python -m trainers.tune``) on one node: a local
    Ray cluster of the node's CPUs (and GPUs) runs the trials, each a Ray Train run of
    ``trainer`` on ``workers`` workers, ASHA stopping the trials whose eval loss falls behind.

    The search directory is the trainers' ``--output-dir`` (default ``outputs/<app id>``); a
    retried or resubmitted job with the same directory resumes the search there. The search
    is checked before the job is scheduled: the expressions, the trainer and its options with
    each searched value.

    Args:
        script_args: the fixed trainer options, e.g. ``--model small --steps 400``
        trainer: the trainer of every trial: ddp, fsdp, tensor_parallel or pipeline
        search: the searched options, space-separated OPTION=KIND:ARGS expressions, e.g.
            "lr=loguniform:1e-4:1e-2 batch-size=choice:8,16" (python -m trainers.tune --help)
        workers: Ray Train workers (ranks) per trial, one CPU (or GPU) each
        trials: samples of the search space (each grid multiplies them)
        max_concurrent: trials at once (0: as many as the node places)
        seed: seed of the search's draws (-1: none)
        image: container image for container schedulers (ignored by local_cwd)
        cpu: CPUs of the node, all given to Ray (0: 2 on CPU nodes, 8 per GPU on GPU nodes)
        gpu: GPUs of the node (a trial's workers take one each)
        memMB: memory of the node in MB (0: 4096 on CPU nodes, 32768 per GPU)
        h: a registered named resource (takes precedence over cpu, gpu and memMB)
        env: extra environment variables, e.g. MLFLOW_TRACKING_URI=http://mlflow:5000
        max_retries: scheduler retries of the job; each resumes the search
        mounts: mounts, e.g. type=bind,src=/data,dst=/data
    """
    gpus, resource = node_resource(h, mounts, cpu, gpu, memMB)
    args = with_output_dir(script_args)
    try:
        entry = trainer_table.trainer(trainer)
        if entry.ray is not None:
            raise ConfigError(f"--trainer {trainer} cannot run under Ray Train: {entry.ray}")
        cfg = parse_config(args, trainer, world_sizes=[workers], check_paths=False,
                           reach_stores=False)
        check_search(search.split(), SearchOptions(trials, max_concurrent, 0, 2.0), trainer,
                     args, workers, cfg)
        if workers > (gpus or resource.cpu):
            what = f"{gpus} GPUs" if gpus else f"{resource.cpu} CPUs"
            raise ConfigError(f"--workers {workers} per trial, but the node has {what}; pass "
                              f"--workers {gpus or resource.cpu} or fewer, or a bigger node")
    except ConfigError as err:
        raise ComponentArgumentError(f"trainers.tune: {err}") from None
    role = specs.Role(
        name="tune", image=image, entrypoint="python",
        args=["-m", "trainers.tune", *_search_args(trainer, search, workers, trials,
                                                  max_concurrent, seed, int(resource.cpu), gpus),
              "--", *args],
        env=dict(env or {}), num_replicas=1, resource=resource, max_retries=max_retries,
        retry_policy=specs.RetryPolicy.APPLICATION,
        mounts=specs.parse_mounts(mounts) if mounts else [])
    return specs.AppDef(name="tune", roles=[role])

"""Every kind of wrong ``torchx run`` invocation, across the components and the local_cwd,
Slurm and Kubernetes schedulers, through the real CLI: each is refused with exit 1 and one
error line that names the fix, without a traceback, and nothing is scheduled.

The rows are this module's (trainer arguments, launch options, fault injection) plus the Slurm
and Kubernetes option tables of tests/system/test_bad_input_slurm.py and
tests/integration/test_kubernetes_options.py, which those modules also check on their own terms.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.test_config import bad_data_files
from tests.integration.test_kubernetes_options import BAD_INPUT as KUBERNETES_BAD_INPUT
from tests.support.runs import REPO
from tests.support.slurm import queued_jobs_from, torchx, trainer_args
from tests.system.test_slurm import BAD_OPTIONS as SLURM_BAD_CLUSTER_OPTIONS
from tests.system.test_slurm import BAD_OPTIONS_ANYWHERE as SLURM_BAD_OPTIONS
from trainers.runs.checkpoint_files import FORMAT

# The words by which an error line names its fix.
FIX = re.compile(r"\b(pass|use|try|lower|pick|drop|list|tokenize|instead|did you mean|such as)\b"
                 r"|e\.g\.", re.IGNORECASE)


@dataclass(frozen=True)
class Row:
    """One wrong invocation: ``torchx run -s scheduler [-cfg cfg] components/<C>.py:<C> -j j
    *options -- *trainer`` (``builtin``: ``<C>`` instead of the path) whose error line starts
    with (``exact``: is) ``error``.

    ``{tmp}`` in ``cfg``, ``options``, ``trainer`` and ``error`` stands for the row's own
    temporary directory, which is also the directory the CLI runs in (no .torchxconfig, HOME).
    """

    id: str
    scheduler: str
    component: str
    error: str
    j: str = "1x2"
    options: tuple[str, ...] = ()
    trainer: tuple[str, ...] = ("--model", "tiny", "--steps", "20")
    cfg: str = ""
    exact: bool = True
    ends: str = ""  # and (for a row that is not exact) its end
    workspace: str | None = None  # --workspace instead of the scheduler's (kubernetes: none)
    env: tuple[tuple[str, str], ...] = ()  # extra environment of the CLI
    builtin: bool = False  # name the component as TorchX's builtin (``ddp``), not by its file

    def args(self, tmp: Path) -> list[str]:
        """The CLI arguments (kubernetes rows are dry runs: no API server is needed)."""
        def fill(values: tuple[str, ...]) -> list[str]:
            return [v.replace("{tmp}", str(tmp)) for v in values]

        (cfg,) = fill((self.cfg,))
        run = ["run", "--dryrun"] if self.scheduler == "kubernetes" else ["run"]
        workspace = {"kubernetes": "", "slurm": f"file://{REPO}"}.get(self.scheduler)
        (workspace,) = fill((self.workspace,)) if self.workspace is not None else (workspace,)
        if workspace is not None:
            run += ["--workspace", workspace]
        if self.scheduler == "slurm":
            given = dict(kv.split("=", 1) for kv in filter(None, cfg.split(",")))
            defaults = {"partition": "debug", "time": "15", "job_dir": str(tmp / "jobs")}
            cfg = ",".join(f"{k}={v}" for k, v in {**defaults, **given}.items())
        name = (self.component if self.builtin else
                f"{REPO / 'components' / self.component}.py:{self.component}")
        return [*run, "-s", self.scheduler, *(["-cfg", cfg] if cfg else []), name, "-j", self.j,
                *fill(self.options), "--", *fill(self.trainer)]


def _slug(*parts: str) -> str:
    """A test id from ``parts``: runs of other characters than letters and digits become -."""
    return re.sub(r"[^A-Za-z0-9]+", "-", " ".join(parts)).strip("-")


ROWS = [
    # trainer arguments, each checked by the trainer's own parser in the component
    Row("batch-not-divisible", "local_cwd", "ddp",
        "trainers.ddp: --batch-size 15 is not divisible by --grad-accum 1 x data-parallel size "
        "2; pass a multiple of 2", trainer=("--model", "tiny", "--batch-size", "15")),
    Row("tp-not-dividing-heads", "local_cwd", "tensor_parallel",
        "trainers.tensor_parallel: --tp 3 does not divide the tiny model's heads (4); pass a "
        "--tp that divides 4", j="1x3", trainer=("--model", "tiny", "--tp", "3")),
    Row("tp-not-dividing-world", "kubernetes", "tensor_parallel",
        "trainers.tensor_parallel: --tp 4 does not divide the world size 6; pass a --tp that "
        "divides the number of ranks", j="2x3", cfg="queue=q", trainer=("--tp", "4")),
    Row("pipeline-stages-vs-layers", "local_cwd", "pipeline",
        "trainers.pipeline: --pp 4 x --virtual-stages 2 = 8 stages do not divide the tiny "
        "model's 4 blocks; pick degrees whose product divides them", j="1x4",
        trainer=("--pp", "4", "--virtual-stages", "2", "--schedule", "interleaved1f1b")),
    Row("pipeline-microbatches", "slurm", "pipeline",
        "trainers.pipeline: each pipeline's batch of 6 sequences does not split into "
        "--microbatches 4; pass a divisor of it", j="2x1",
        trainer=("--pp", "2", "--batch-size", "6")),
    # a tensor-parallel group across nodes: --tp must divide the processes per node
    *[Row(f"pipeline-tp-across-nodes-{scheduler}", scheduler, "pipeline",
          "trainers.pipeline: --tp 4 does not divide the 2 processes per node, so a "
          "tensor-parallel group would span nodes; pass a --tp that divides 2 (PP and DP span "
          "nodes), or --allow-cross-node-tp if your fabric between nodes is as fast", j="4x2",
          cfg=cfg, trainer=("--model", "tiny", "--pp", "2", "--tp", "4"))
      for scheduler, cfg in (("local_cwd", ""), ("kubernetes", "queue=q"))],
    Row("tensor-parallel-tp-across-nodes-slurm", "slurm", "tensor_parallel",
        "trainers.tensor_parallel: --tp 4 does not divide the 2 processes per node, so a "
        "tensor-parallel group would span nodes; pass a --tp that divides 2 (PP and DP span "
        "nodes), or --allow-cross-node-tp if your fabric between nodes is as fast", j="2x2",
        trainer=("--model", "tiny", "--tp", "4")),
    Row("preemption-signal-unknown", "local_cwd", "ddp",
        "trainers.ddp: --preemption-signals SIGTERM,SIGUSR3: SIGUSR3 is not a signal; pass names "
        "such as SIGTERM,SIGUSR1 (see `kill -l`), or none",
        trainer=("--preemption-signals", "SIGTERM,SIGUSR3")),
    Row("preemption-signal-uncatchable", "slurm", "fsdp",
        "trainers.fsdp: --preemption-signals KILL: SIGKILL cannot be caught, so no checkpoint can "
        "be saved on it; pass catchable signals such as SIGTERM,SIGUSR1",
        trainer=("--preemption-signals", "KILL")),
    Row("option-of-another-trainer", "local_cwd", "ddp",
        "trainers.ddp: --cpu-offload is not served by trainers.ddp; use trainers.fsdp or "
        "trainers.pipeline or drop --cpu-offload", trainer=("--cpu-offload",)),
    Row("option-of-another-trainer-slurm", "slurm", "fsdp",
        "trainers.fsdp: --tp is not served by trainers.fsdp; use trainers.tensor_parallel or "
        "trainers.pipeline or drop --tp", j="2x1", trainer=("--tp", "2")),
    Row("unknown-trainer-option", "local_cwd", "fsdp",
        "trainers.fsdp: unrecognized arguments: --learning-rate 0.1; pass only options that "
        "`python -m trainers.fsdp --help` lists", trainer=("--learning-rate", "0.1")),
    Row("abbreviated-trainer-option", "local_cwd", "ddp",
        "trainers.ddp: unrecognized arguments: --check 5; did you mean --checkpoint-every? "
        "(`python -m trainers.ddp --help` lists the options)", trainer=("--check", "5")),
    Row("model-parallel-bad-device", "local_cwd", "model_parallel",
        "trainers.model_parallel: --devices gpu0,gpu1: 'gpu0' is not a device; list cpu or "
        "cuda:N entries, e.g. cuda:0,cuda:1", j="1x1", trainer=("--devices", "gpu0,gpu1")),
    Row("model-parallel-missing-gpus", "kubernetes", "model_parallel",
        "trainers.model_parallel: --devices cuda:0,cuda:1 needs --gpu 2 or more, not --gpu 0; "
        "pass --gpu 2", j="1x1", cfg="queue=q", trainer=("--devices", "cuda:0,cuda:1")),
    Row("model-parallel-processes", "local_cwd", "model_parallel",
        "trainers.model_parallel: model_parallel runs one process per node over --devices; pass "
        "-j <nodes>x1, not 2 processes per node", trainer=("--devices", "cpu,cpu")),
    Row("resume-another-model", "local_cwd", "ddp",
        "trainers.ddp: {tmp}/small-run holds a --model small checkpoint, not tiny; pass --model "
        "small, another --output-dir or --resume none",
        trainer=("--model", "tiny", "--resume", "{tmp}/small-run")),
    Row("resume-earlier-format", "local_cwd", "fsdp",
        "trainers.fsdp: {tmp}/old-run holds a format-1 checkpoint from an earlier version of "
        "these trainers, which read format 2; resume it with the version that wrote it, or pass "
        "--resume none with a new --output-dir", trainer=("--resume", "{tmp}/old-run")),
    Row("lora-target-not-in-model", "local_cwd", "fsdp",
        "trainers.fsdp: --lora-targets q_proj matches no linear layer of the model; pass some "
        "of down,head,up,wk,wo,wq,wv",
        trainer=("--model", "tiny", "--lora-rank", "4", "--lora-targets", "wq,q_proj")),
    Row("unknown-tracker", "local_cwd", "fsdp",
        "trainers.fsdp: --tracker comet is not a tracker; pick from tensorboard, mlflow, wandb "
        "or none (comma-separated)", trainer=("--model", "tiny", "--tracker", "mlflow,comet")),
    Row("chat-without-field", "local_cwd", "fsdp",
        "trainers.fsdp: {tmp}/chat.jsonl:1: no field 'messages' holding a list of {role, "
        "content} turns; pass the --messages-field that holds them, or --data-format",
        trainer=("--data", "{tmp}/chat.jsonl", "--data-format", "chat")),
    Row("missing-data-file", "local_cwd", "fsdp", "trainers.fsdp: --data {tmp}/corpus.bin:",
        trainer=("--data", "{tmp}/corpus.bin"), exact=False),
    Row("tokenizer-does-not-load", "local_cwd", "ddp",
        "trainers.ddp: --tokenizer {tmp}/broken.json does not load (",
        trainer=("--data", "{tmp}/plain.txt", "--tokenizer", "{tmp}/broken.json"), exact=False),
    Row("tokenizer-vocab-exceeds-model", "local_cwd", "fsdp",
        "trainers.fsdp: --tokenizer {tmp}/big.json has 1,001 ids, more than the model's "
        "vocabulary of 256; pick a model with a larger vocabulary or pass --tokenizer bytes "
        "(one id per byte)",
        trainer=("--data", "{tmp}/plain.txt", "--tokenizer", "{tmp}/big.json")),
    Row("every-instruction-sample-too-long", "local_cwd", "ddp",
        "trainers.ddp: --seq-len 64 cuts the whole completion of all 2 samples of --data "
        "{tmp}/long.jsonl; pass --seq-len 120 or more, or shorten the prompts",
        trainer=("--data", "{tmp}/long.jsonl")),
    Row("raw-bin-without-vocab-size", "local_cwd", "ddp",
        "trainers.ddp: a raw .bin --data needs --token-dtype and --vocab-size; pass --vocab-size "
        "N (ids below N)", trainer=("--data", "{tmp}/raw.bin", "--token-dtype", "uint16")),
    Row("raw-bin-ids-beyond-vocab", "local_cwd", "ddp",
        "trainers.ddp: --data {tmp}/raw.bin holds id 300, beyond --vocab-size 256; pass "
        "--vocab-size 301 or more (or the right --token-dtype)",
        trainer=("--data", "{tmp}/raw.bin", "--token-dtype", "uint16", "--vocab-size", "256")),
    Row("data-empty-directory", "local_cwd", "ddp",
        "trainers.ddp: --data {tmp}/empty: the directory holds no files; pass a directory of "
        ".txt, .jsonl or .parquet files", trainer=("--data", "{tmp}/empty")),
    Row("data-glob-matches-nothing", "local_cwd", "pipeline",
        "trainers.pipeline: --data {tmp}/*.parquet: the glob matches no files; pass a pattern "
        "that matches .txt, .jsonl or .parquet files; if it exists only where the job runs, "
        "pass --check_paths False", trainer=("--pp", "2", "--data", "{tmp}/*.parquet")),
    Row("data-unknown-suffix", "local_cwd", "ddp",
        "trainers.ddp: --data {tmp}/notes.csv: {tmp}/notes.csv has an unknown suffix; pass only "
        ".txt, .md, .py, .jsonl or .parquet files (or a token file ending .bin)",
        trainer=("--data", "{tmp}/notes.csv")),
    Row("model-module-does-not-import", "local_cwd", "ddp",
        "trainers.ddp: --model no_such_module:SPEC: module no_such_module does not import (No "
        "module named 'no_such_module'); pass a module importable from the working directory or "
        "an installed package", trainer=("--model", "no_such_module:SPEC")),
    Row("model-hf-without-config", "local_cwd", "fsdp",
        "trainers.fsdp: --model hf:{tmp}/empty: {tmp}/empty/config.json does not exist; pass hf: "
        "and a local directory holding a Hugging Face config.json; if it exists only where the "
        "job runs, pass --check_paths False", trainer=("--model", "hf:{tmp}/empty")),
    Row("tp-on-a-model-without-a-plan", "local_cwd", "tensor_parallel",
        "trainers.tensor_parallel: --model hf:{tmp}/hf has no tensor-parallel plan; pass --tp 1 "
        "(e.g. trainers.fsdp) or give its ModelSpec a tp_plan",
        trainer=("--model", "hf:{tmp}/hf", "--tp", "2")),
    Row("jsonl-line-without-text-field", "local_cwd", "ddp",
        "trainers.ddp: {tmp}/docs.jsonl:2: no string field 'text'; pass the --text-field that "
        "holds the text, or fix the line", trainer=("--data", "{tmp}/docs.jsonl")),
    Row("vocab-size-with-synthetic-data", "kubernetes", "ddp",
        "trainers.ddp: --vocab-size applies only to a raw .bin --data (ids without a header), "
        "not synthetic data; drop --vocab-size", cfg="queue=q",
        trainer=("--vocab-size", "50304")),
    Row("model-does-not-fit", "local_cwd", "ddp",
        "trainers.ddp: --model 1b needs", trainer=("--model", "1b"), exact=False),
    Row("model-does-not-fit-gpu", "slurm", "fsdp", "trainers.fsdp: --model 7b needs", j="2x1",
        options=("--gpu", "1", "--device_memory_gb", "16"), trainer=("--model", "7b"),
        exact=False),
    Row("data-only-on-the-cluster", "slurm", "ddp",
        "trainers.ddp: --data /cluster/tokens.bin: no such file; make one with `python -m "
        "trainers.tools.prepare_data TEXT OUT.bin` or use synthetic; if it exists only where the "
        "job runs, pass --check_paths False", trainer=("--data", "/cluster/tokens.bin")),
    Row("output-dir-not-writable", "local_cwd", "ddp",
        "trainers.ddp: --output-dir /proc/run: /proc cannot be written", exact=False,
        trainer=("--model", "tiny", "--output-dir", "/proc/run")),
    # GPUs, per-GPU resources and the memory pre-flight of GPU jobs
    Row("fewer-gpus-than-processes", "local_cwd", "ddp",
        "trainers.ddp: 8 processes per node with --gpu 4: each process drives one GPU; pass -j "
        "<nodes>x4, or --gpu 8", j="1x8", options=("--gpu", "4", "--gpu_type", "h100")),
    Row("more-gpus-than-processes", "slurm", "fsdp",
        "trainers.fsdp: 2 processes per node with --gpu 8: each process drives one GPU; pass -j "
        "<nodes>x8, or --gpu 2", options=("--gpu", "8", "--gpu_type", "h100")),
    Row("gpu-job-without-its-memory", "slurm", "ddp",
        "trainers.ddp: --gpu 8: name the GPUs so the job is checked to fit before it is "
        "scheduled; pass --gpu_type (one of", j="2x8", options=("--gpu", "8"), exact=False),
    Row("unknown-gpu-type", "kubernetes", "ddp",
        "trainers.ddp: --gpu_type a100 is not a GPU this repository knows; did you mean "
        "a100-40gb or a100-80gb?", j="1x2", options=("--gpu", "2", "--gpu_type", "a100"),
        cfg="queue=q", exact=False),
    Row("gpu-type-on-a-cpu-job", "local_cwd", "ddp",
        "trainers.ddp: --gpu_type describes GPUs, but the job asks for none; pass --gpu N (one "
        "per process), or drop --gpu_type", options=("--gpu_type", "h100")),
    Row("ddp-7b-on-h100s", "slurm", "ddp",
        "trainers.ddp: --model 7b needs 133.11 GiB per rank, devices have 80.00 (72.00 usable); "
        "try trainers.fsdp",
        j="2x8", options=("--gpu", "8", "--gpu_type", "h100"), trainer=("--model", "7b"),
        exact=False),
    Row("cpu-job-names-memmb", "slurm", "fsdp",
        "trainers.fsdp: --model 7b needs 23.95 GiB per rank, devices have 0.50 (0.45 usable);",
        j="2x8",
        trainer=("--model", "7b", "--batch-size", "16"), exact=False,
        ends="; or pass more --memMB (now 4096 MB per node, shared by 8 processes)"),
    Row("cpu-job-over-the-hosts-memory", "local_cwd", "fsdp",
        "trainers.fsdp: --model 7b needs 23.95 GiB per rank, 383.27 GiB for the job's 16 "
        "processes on this host, which has ", j="2x8",
        trainer=("--model", "7b", "--batch-size", "16"), exact=False,
        ends="; pass fewer processes (-j), a smaller --batch-size or --model, or free memory"),
    # launch options, read strictly before TorchX parses them
    Row("bool-option-not-a-bool", "local_cwd", "ddp",
        "ddp: --check_paths nope: not a bool; pass --check_paths True or --check_paths False",
        options=("--check_paths", "nope")),
    Row("env-without-equals", "local_cwd", "ddp",
        "ddp: --env FOO: not KEY=VALUE; pass --env KEY=VALUE[,KEY=VALUE...], e.g. --env "
        "OMP_NUM_THREADS=1,NCCL_DEBUG=WARN", options=("--env", "FOO")),
    Row("trainer-option-before-the-dashes", "local_cwd", "fsdp",
        "fsdp: --model is not an option of the component; trainer options go after --, e.g. "
        "torchx run {repo}/components/fsdp.py:fsdp -j 1x2 -- --model ...",
        options=("--model", "tiny"), trainer=()),
    Row("misspelt-component-option", "local_cwd", "ddp",
        "ddp: --gpus is not an option of the component; did you mean --gpu?",
        options=("--gpus", "2")),
    Row("misspelt-option-of-a-builtin-name", "local_cwd", "fsdp",
        "fsdp: --gpus is not an option of the component; did you mean --gpu?",
        options=("--gpus", "2"), builtin=True),
    Row("kubernetes-workspace-without-docker", "kubernetes", "ddp",
        "kubernetes: --workspace file://{tmp} is built into an image on top of --image through "
        "a Docker API, and none answers at unix://{tmp}/none.sock (DockerException); pass "
        "--workspace \"\" to run --image as built", cfg="queue=q", workspace="file://{tmp}",
        env=(("DOCKER_HOST", "unix://{tmp}/none.sock"),), exact=False),
    # run options of every scheduler (-cfg): unknown keys and values that do not parse
    Row("local-cwd-unknown-run-option", "local_cwd", "ddp",
        "local_cwd: -cfg foo=bar: local_cwd has no run option foo; pass one of "
        "auto_set_cuda_visible_devices, log_dir, prepend_cwd (`torchx runopts local_cwd` lists "
        "them)", cfg="foo=bar"),
    Row("slurm-misspelt-partition", "slurm", "ddp",
        "slurm: -cfg partiton=gpu: slurm has no run option partiton; did you mean partition? "
        "(`torchx runopts slurm` lists them)", cfg="partiton=gpu"),
    Row("slurm-bool-not-a-bool", "slurm", "ddp",
        "slurm: -cfg exclusive=yes is not a bool; pass exclusive=True or exclusive=False",
        cfg="exclusive=yes"),
    Row("slurm-signal-grace-not-seconds", "slurm", "ddp",
        "slurm: -cfg signal_grace=5m is not an int; pass e.g. signal_grace=1",
        cfg="signal_grace=5m"),
    Row("kubernetes-misspelt-namespace", "kubernetes", "ddp",
        "kubernetes: -cfg namepsace=team-a: kubernetes has no run option namepsace; did you mean "
        "namespace? (`torchx runopts kubernetes` lists them)", cfg="queue=q,namepsace=team-a"),
    # launch options
    Row("bad-j", "local_cwd", "ddp",
        "-j 2xtwo: expected [min_nodes:]NODESxPROCS_PER_NODE, e.g. 1x2 or 1:2x4", j="2xtwo"),
    Row("bad-j-range", "slurm", "ddp",
        "-j 3:2x1: need 1 <= min_nodes <= nodes; pass e.g. -j 2x2 or -j 1:2x2", j="3:2x1"),
    Row("bad-rdzv-port", "local_cwd", "ddp",
        "--rdzv_port 70000: not a TCP port; pass 1-65535, or 0 for a free port", j="2x1",
        options=("--rdzv_port", "70000")),
    Row("bad-kill-at", "local_cwd", "ddp",
        "trainers.ddp: TRAINERS_KILL_AT=1-6: expected RANK:STEP[:step|save|upload|node] with "
        "STEP >= 1, e.g. 1:6 or 0:8:save",
        options=("--env", "TRAINERS_KILL_AT=1-6")),
    Row("kill-at-missing-rank", "slurm", "ddp",
        "trainers.ddp: TRAINERS_KILL_AT=4:6 names rank 4, but the job has ranks 0-1; pass a "
        "rank below 2", j="2x1", options=("--env", "TRAINERS_KILL_AT=4:6")),
    # Slurm options (tests/system/test_bad_input_slurm.py)
    *[Row(_slug("slurm", cfg or f"-j {j}"), "slurm", component, message, j=j, cfg=cfg,
          trainer=tuple(trainer_args(batch_size=48)))
      for cfg, component, j, message in SLURM_BAD_OPTIONS + SLURM_BAD_CLUSTER_OPTIONS],
    # Kubernetes options (tests/integration/test_kubernetes_options.py)
    *[Row(_slug("kubernetes", cfg.removeprefix("queue=q") if cfg else "no queue", *options),
          "kubernetes", "ddp", start, j="2x2", options=tuple(options), cfg=cfg, exact=False)
      for cfg, options, start in KUBERNETES_BAD_INPUT],
    Row("kubernetes-queue-name", "kubernetes", "fsdp",
        "kubernetes: queue='Research_Q' is invalid: must be a DNS-1123 subdomain", j="1x2",
        cfg="queue=Research_Q", exact=False),
    Row("kubernetes-shm-quantity", "kubernetes", "pipeline",
        "kubernetes: shm_size='lots' is invalid: expected a positive quantity such as 512Mi, "
        "2Gi or 1G", cfg="queue=q,shm_size=lots", trainer=("--pp", "2")),
    Row("kubernetes-node-shapes", "kubernetes", "ddp",
        "kubernetes: node_shapes='8cpu' is invalid: expected CPUS/MEMORY[/GPUS] items, e.g. "
        "node_shapes=8/32Gi;96/1100Gi/8", cfg="queue=q,node_shapes=8cpu"),
    Row("kubernetes-grace-not-an-int", "kubernetes", "ddp",
        "kubernetes: -cfg termination_grace_s=2m is not an int; pass e.g. termination_grace_s=1",
        cfg="queue=q,termination_grace_s=2m"),
    Row("kubernetes-grace-negative", "kubernetes", "fsdp",
        "kubernetes: termination_grace_s=-30 is negative; pass the seconds a step plus a "
        "checkpoint save take, e.g. termination_grace_s=300",
        cfg="queue=q,termination_grace_s=-30"),
    Row("kubernetes-grace-zero", "kubernetes", "ddp",
        "kubernetes: termination_grace_s=0 kills an evicted or preempted pod at once, before the "
        "trainers can save a checkpoint; pass the seconds a step plus a checkpoint save take, "
        "e.g. termination_grace_s=300", cfg="queue=q,termination_grace_s=0"),
    Row("kubernetes-grace-over-torchrun-shutdown", "kubernetes", "ddp",
        "kubernetes: termination_grace_s=1200 exceeds torchrun's PET_SHUTDOWN_TIMEOUT=900, after "
        "which it kills the trainers mid-save; lower termination_grace_s or pass --env "
        "PET_SHUTDOWN_TIMEOUT=1200", cfg="queue=q,termination_grace_s=1200"),
]


def _checkpointed_runs(tmp: Path) -> None:
    """Run directories whose newest checkpoint's manifest says ``--model small`` (small-run)
    and whose checkpoint is in an earlier format (old-run)."""
    for run, manifest in (("small-run", {"format": FORMAT, "model": "small", "files": {}}),
                          ("old-run", {"model": "tiny", "files": {}})):
        step = tmp / run / "checkpoints" / "step_00000004"
        step.mkdir(parents=True)
        (step / "manifest.json").write_text(json.dumps(manifest))


LOCAL_ROWS = [row for row in ROWS if row.scheduler != "slurm"]
# The Slurm rows run against the cluster in tests/system/test_bad_input_slurm.py.
SLURM_ROWS = [row for row in ROWS if row.scheduler == "slurm"]


@pytest.mark.parametrize("row", LOCAL_ROWS, ids=[row.id for row in LOCAL_ROWS])
def test_bad_input_is_refused_in_one_line_and_nothing_is_scheduled(tmp_path, row):
    assert_refused(row, tmp_path)


def assert_refused(row: Row, tmp_path: Path) -> None:
    """``row``'s invocation exits 1 with one line (the row's error, naming a fix) after TorchX's
    "Failed to run component", and schedules nothing."""
    _checkpointed_runs(tmp_path)
    bad_data_files(tmp_path)
    env = {"HOME": str(tmp_path)} | {k: v.replace("{tmp}", str(tmp_path)) for k, v in row.env}
    proc = torchx(*row.args(tmp_path), cwd=tmp_path, env=env, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    lines = proc.stderr.splitlines()
    failed = [i for i, line in enumerate(lines) if line.startswith("Failed to run component")]
    assert failed and failed[-1] == len(lines) - 2, proc.stderr[-3000:]  # then one line
    expected = " " + row.error.replace("{tmp}", str(tmp_path)).replace("{repo}", str(REPO))
    error = lines[-1]
    assert error == expected if row.exact else error.startswith(expected), (error, expected)
    assert error.endswith(row.ends), (error, row.ends)
    assert FIX.search(error), error
    # nothing scheduled: no handle or request printed, no run directory, no Slurm job
    assert "://" not in proc.stdout and "=== SCHEDULER REQUEST ===" not in proc.stdout
    assert not (tmp_path / "outputs").exists()
    if row.scheduler == "slurm":
        assert not (tmp_path / ".torchxslurmjobdirs").exists()
        assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())
        assert queued_jobs_from(tmp_path) == []

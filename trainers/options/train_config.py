"""The one typed configuration of a training run: :class:`TrainConfig`, its fields and defaults.

The modules that check, resolve or parse a config (:mod:`~trainers.config.parsing`,
:mod:`~trainers.config.checks`, :mod:`~trainers.formats.data_source`,
:mod:`~trainers.options.trainer_table`) import it, and it imports none of them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trainers.options.model_names import MODEL_HELP, model_shape
from trainers.runs.preemption_signals import DEFAULT as PREEMPTION_DEFAULT

# --token-dtype's names: the numpy dtype strings of a raw token file's id widths.
TOKEN_DTYPES = {"uint16": "<u2", "uint32": "<u4"}

# Pipeline schedules and the stages per rank each runs: one, or two or more (virtual stages).
SCHEDULE_STAGES = {"gpipe": "one", "1f1b": "one", "interleaved1f1b": "several",
                   "zerobubble": "several"}


def _opt(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class TrainConfig:
    """Everything a training run needs; see ``python -m trainers.ddp --help``."""

    # model
    model: str = _opt("tiny", MODEL_HELP)
    seq_len: int = _opt(0, "tokens per sequence (0: the model's context length)")
    dropout: float = _opt(0.0, "dropout probability")
    attention: str = _opt("sdpa", "attention implementation (trainers/models/attention.py); "
                          "only sdpa has attention dropout",
                          choices=["sdpa", "naive", "tiled", "sliding_window", "linear"])
    attention_window: int = _opt(256, "keys each query sees under --attention sliding_window")
    # data
    data: str = _opt("synthetic", "'synthetic' (built-in Markov-chain data); a token file made "
                     "by `python -m trainers.tools.prepare_data`; a raw .bin of ids "
                     "(with --token-dtype and --vocab-size); or a .txt/.jsonl/.parquet file, "
                     "directory or glob, tokenized once into <output-dir>/data/ (docs/data.md)")
    token_dtype: str = _opt("", "raw .bin --data: the ids' dtype", choices=sorted(TOKEN_DTYPES))
    vocab_size: int = _opt(0, "raw .bin --data: ids lie below this (0: not a raw .bin)")
    tokenizer: str = _opt("bytes", "text --data: 'bytes' (UTF-8 bytes, vocabulary 256) or the "
                          "path of a Hugging Face tokenizer.json")
    text_field: str = _opt("text", "text --data: the .jsonl field or .parquet column holding "
                           "each document's text")
    data_format: str = _opt("auto", "text --data: 'text' (every token in the loss), "
                            "'prompt_completion' or 'chat' (only completion or assistant tokens "
                            "in the loss; docs/finetuning.md); auto: chat if the records have "
                            "--messages-field, prompt_completion if they have --prompt-field, "
                            "else text", choices=["auto", "text", "prompt_completion", "chat"])
    messages_field: str = _opt("messages", "chat --data: the field holding each sample's "
                               "list of {role, content} turns")
    prompt_field: str = _opt("prompt", "prompt_completion --data: the prompt's field")
    completion_field: str = _opt("completion", "prompt_completion --data: the completion's "
                                 "field")
    chat_template: str = _opt("", "chat --data: a Jinja chat template file (default: the "
                              "tokenizer's own chat_template, else the built-in one in "
                              "docs/finetuning.md)")
    batching: str = _opt("auto", "instruction and chat --data: 'pack' (samples packed into "
                         "--seq-len, attention kept within each: built-in and hf: models, sdpa "
                         "attention, --pp 1 and --tp 1), 'pad' (one sample a sequence, batches "
                         "of similar lengths cut to their longest); auto: pack where it can, "
                         "else pad", choices=["auto", "pad", "pack"])
    long_samples: str = _opt("skip", "instruction and chat --data: a sample whose whole "
                             "completion --seq-len cuts (its prompt is longer than --seq-len "
                             "tokens): 'skip' it (one line says how many, and the --seq-len "
                             "that keeps them all; summary.json: skipped_samples), or 'error' "
                             "(refuse the run, naming it)", choices=["skip", "error"])
    train_samples: int = _opt(8192, "sequences in the synthetic training set")
    val_samples: int = _opt(512, "sequences in the synthetic validation set")
    val_fraction: float = _opt(0.05, "share of the tokens of any --data but synthetic held "
                               "out for evaluation")
    num_workers: int = _opt(0, "DataLoader worker processes per rank")
    prefetch_factor: int = _opt(2, "batches each DataLoader worker loads ahead")
    # batch and optimisation
    batch_size: int = _opt(32, "global batch in sequences "
                           "(= micro-batch x grad-accum x data-parallel size)")
    grad_accum: int = _opt(1, "micro-batches accumulated per optimizer step")
    steps: int = _opt(100, "optimizer steps")
    lr: float = _opt(3e-3, "peak learning rate (AdamW)")
    min_lr_ratio: float = _opt(0.1, "final learning rate as a share of --lr (cosine decay)")
    warmup_steps: int = _opt(10, "linear warm-up steps")
    weight_decay: float = _opt(0.1, "AdamW weight decay on matrices")
    grad_clip: float = _opt(1.0, "max global gradient norm (0: no clipping)")
    seed: int = _opt(1234, "seed for weights, data order and dropout")
    # execution
    dtype: str = _opt("fp32", "compute dtype: fp32, or bf16 autocast", choices=["fp32", "bf16"])
    activation_checkpointing: bool = _opt(False, "recompute each block's activations in backward")
    compile: bool = _opt(False, "torch.compile each block (inductor; the first steps include "
                         "compilation, reported as compile_time_s)", negatable=True)
    device: str = _opt("auto", "auto (cuda if visible, else cpu), cpu or cuda",
                       choices=["auto", "cpu", "cuda"])
    backend: str = _opt("auto", "process-group backend: auto (nccl on cuda, else gloo), gloo, nccl",
                        choices=["auto", "gloo", "nccl"])
    pg_timeout: float = _opt(0.0, "seconds a collective may wait before the process group "
                             "raises (0: torch's default, 10 min for nccl and 30 for gloo); a hung "
                             "rank then ends the run with an error instead of holding the job")
    tf32: bool = _opt(True, "fp32 matmuls and cuDNN convolutions in TensorFloat-32 on CUDA "
                      "devices of compute capability 8.0 (Ampere) or newer; no effect elsewhere "
                      "(--no-tf32 or --tf32 false: full fp32)", negatable=True)
    # parallelism (each option belongs to the trainers whose registry entry lists it)
    tp: int = _opt(1, "tensor-parallel degree: ranks that split each block's matmuls")
    dp: int = _opt(0, "data-parallel degree (0: world size / (tp x pp)); dp x tp x pp must "
                   "equal the world size")
    allow_cross_node_tp: bool = _opt(False, "let a tensor-parallel group span nodes (--tp not "
                                     "dividing the processes per node): for fabrics as fast "
                                     "between nodes as inside one")
    sequence_parallel: bool = _opt(False, "shard norms and the residual stream along the sequence "
                                   "between tensor-parallel regions")
    grad_reduce_dtype: str = _opt("fp32", "DDP: the dtype gradients are all-reduced in: fp32 "
                                  "(exact) or bf16 (half the bytes, for jobs the network "
                                  "bounds; each reduced gradient is rounded to bf16, so the "
                                  "losses differ slightly from fp32's)",
                                  choices=["fp32", "bf16"])
    reshard_after_forward: bool = _opt(True, "FSDP: free gathered parameters after forward "
                                       "(ZeRO-3); false keeps them until backward (ZeRO-2)")
    cpu_offload: bool = _opt(False, "FSDP: keep sharded parameters, gradients and optimizer "
                             "state in CPU memory; the optimizer steps on the CPU")
    pp: int = _opt(1, "pipeline-parallel degree: ranks each holding consecutive blocks")
    virtual_stages: int = _opt(1, "pipeline stages per rank (2 or more for interleaved1f1b "
                               "and zerobubble, 1 for gpipe and 1f1b)")
    schedule: str = _opt("1f1b", "pipeline schedule", choices=list(SCHEDULE_STAGES))
    microbatches: int = _opt(4, "pipeline micro-batches per step; each replica's batch is "
                             "split into them")
    record_timeline: bool = _opt(False, "pipeline: write every step's per-micro-batch forward "
                                 "and backward intervals to timeline.rank<R>.jsonl")
    devices: str = _opt("auto", "model parallel: devices to spread the blocks over, e.g. "
                        "cuda:0,cuda:1 or cpu,cpu (auto: every visible GPU, else cpu,cpu)")
    # fault tolerance across replica groups (trainers.ddp and trainers.fsdp; docs/reliability.md)
    fault_tolerant: bool = _opt(False, "join torchft's per-step quorum as one of "
                                "--replica-groups replica groups (each a torchrun of its own): "
                                "gradients are averaged over the groups alive at each step, a "
                                "lost group restarts alone and heals from a live one's weights "
                                "while the others keep stepping (components/fault_tolerant.py "
                                "starts the lighthouse and the groups)")
    replica_groups: int = _opt(2, "--fault-tolerant: the job's replica groups (--batch-size is "
                               "their global batch)")
    replica_group: int = _opt(0, "--fault-tolerant: this group's index, 0 to --replica-groups - 1")
    lighthouse: str = _opt("", "--fault-tolerant: the torchft lighthouse's URL, "
                           "http://HOST:PORT (empty: $TORCHFT_LIGHTHOUSE, else "
                           "http://localhost:29510)")
    min_replicas: int = _opt(1, "--fault-tolerant: replica groups a step needs to commit; "
                             "fewer alive and the step waits for them")
    quorum_timeout: float = _opt(60.0, "--fault-tolerant: seconds to wait for the lighthouse, a "
                                 "step's quorum and its collectives before the group gives up "
                                 "and restarts")
    # fine-tuning (docs/finetuning.md)
    lora_rank: int = _opt(0, "LoRA: train rank-R adapters on the --lora-targets layers with "
                          "the model frozen (0: train every parameter)")
    lora_alpha: float = _opt(16.0, "LoRA: the adapters' output is scaled by alpha / rank")
    lora_dropout: float = _opt(0.0, "LoRA: dropout on the adapters' input, in [0, 1)")
    lora_targets: str = _opt("", "LoRA: comma-separated last name parts of the linear layers "
                             "to adapt, e.g. wq,wv or q_proj,v_proj (empty: the family's "
                             "default: gpt wq,wk,wv; llama wq,wv; hf:DIR q_proj,v_proj; "
                             "MODULE:ATTR every linear layer in the blocks)")
    # evaluation, logging, checkpoints
    eval_every: int = _opt(50, "evaluate every K steps (0: never)")
    eval_batches: int = _opt(4, "micro-batches per rank in each evaluation")
    log_every: int = _opt(10, "print a line every K steps (metrics.jsonl gets every step)")
    profile_steps: int = _opt(0, "profile the attempt's last N steps with torch.profiler: "
                              "profile.json splits a step into compute, exposed "
                              "communication, data wait and host overhead; "
                              "profile-trace.json is rank 0's trace (0: off)")
    peak_tflops: float = _opt(0.0, "peak TFLOP/s per device for MFU "
                              "(0: measured by a matmul probe)")
    tracker: str = _opt("tensorboard", "experiment trackers to report to, comma-separated or "
                        "repeated: tensorboard (events in the output directory), mlflow "
                        "(MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME), wandb (WANDB_PROJECT, "
                        "WANDB_MODE, WANDB_API_KEY), or none (docs/tracking.md)",
                        repeatable=True)
    tensorboard: bool = _opt(True, "false: leave tensorboard out of --tracker (the older "
                             "spelling of --tracker without it)")
    output_dir: str = _opt("", "run directory: config.json, metrics.jsonl, TensorBoard "
                           "events, checkpoints, summary.json")
    checkpoint_every: int = _opt(50, "save a checkpoint every K steps (0: only at the end)")
    keep_checkpoints: int = _opt(3, "how many of the newest checkpoints to keep")
    async_checkpoint: bool = _opt(True, "write the periodic checkpoints in the background "
                                  "while the next step trains (once the state is copied to CPU "
                                  "memory), committing each after that step; the final and the "
                                  "preemption checkpoint are always synchronous "
                                  "(--no-async-checkpoint: every save blocks)", negatable=True)
    resume: str = _opt("auto", "auto (newest valid checkpoint in the output directory, if any), "
                       "none, or a checkpoint or run directory")
    preemption_signals: str = _opt(PREEMPTION_DEFAULT, "signals on which every rank finishes its "
                                   "step, saves a checkpoint of it and exits 128+signal for the "
                                   "scheduler to restart the job (comma-separated; none: the "
                                   "signals keep their default action)")

    def micro_batch(self, dp_size: int) -> int:
        """Sequences per micro-batch on each of ``dp_size`` data-parallel ranks."""
        return self.batch_size // (self.grad_accum * dp_size)

    def dp_size(self, world_size: int) -> int:
        """Data-parallel replicas in a world of ``world_size`` ranks."""
        return self.dp or world_size // (self.tp * self.pp)

    def replicas(self, world_size: int) -> int:
        """Data-parallel replicas the global batch is split over: the ranks' data-parallel size
        in a world (a replica group under ``--fault-tolerant``) of ``world_size`` ranks, times
        the replica groups."""
        return self.dp_size(world_size) * (self.replica_groups if self.fault_tolerant else 1)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def model_vocab(cfg: TrainConfig) -> int:
    """The vocabulary size of the model ``cfg`` trains: every data check asks here."""
    return model_shape(cfg.model).vocab_size

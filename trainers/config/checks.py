"""The checks of a :class:`trainers.config.parsing.TrainConfig`: each raises a one-line
:class:`ConfigError` naming the fix and changes nothing.

They run in the order :func:`trainers.config.parsing.validate` calls them: the options on
their own (:func:`check_options`), against the model's shape (:func:`check_model_fit`), against
the trainer and every world size the job may run at (:func:`check_job`) and, where the job's
files are visible, against the data, the output directory and ``--resume``
(:func:`check_paths`). Plain Python without torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainers.errors import ConfigError, MissingPathError
from trainers.formats.data_source import check_data, check_data_options
from trainers.options.model_names import HF_PREFIX, in_store
from trainers.options.paths import unwritable_reason
from trainers.options.tracker_names import check_trackers
from trainers.options.trainer_table import serving, trainer
from trainers.runs.checkpoint_files import check_format, find_checkpoints, saved_manifest
from trainers.runs.preemption_signals import parse_signals
from trainers.runs.replica_groups import lighthouse_address
from trainers.runs.storage import (
    RunPath,
    check_store,
    is_remote,
    is_url,
    location,
    store_reason,
)
from trainers.sizing.memory_formulas import HF_LINEARS, linear_sizes, parse_targets
from trainers.sizing.shapes import FAMILIES, MODEL_SIZES, ModelConfig

if TYPE_CHECKING:
    from trainers.options.train_config import TrainConfig

POSITIVE = ("steps", "batch_size", "grad_accum", "train_samples", "val_samples", "eval_batches",
            "log_every", "keep_checkpoints", "prefetch_factor")
NON_NEGATIVE = ("seq_len", "warmup_steps", "eval_every", "checkpoint_every", "num_workers",
                "profile_steps")
NON_NEGATIVE_FLOATS = ("grad_clip", "weight_decay", "peak_tflops")


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def _defaults(cfg: TrainConfig) -> dict[str, Any]:
    """Every option's default (the field defaults of ``cfg``'s dataclass)."""
    return {f.name: f.default for f in dataclasses.fields(cfg)}


def check_options(cfg: TrainConfig) -> None:
    """Each option's range, and the options that only make sense together."""
    for option in POSITIVE:
        if getattr(cfg, option) <= 0:
            raise ConfigError(f"{_flag(option)} must be positive, got {getattr(cfg, option)}")
    for option in NON_NEGATIVE:
        if getattr(cfg, option) < 0:
            raise ConfigError(f"{_flag(option)} must be >= 0, got {getattr(cfg, option)}")
    if cfg.profile_steps >= cfg.steps:
        raise ConfigError(f"--profile-steps {cfg.profile_steps} must be below --steps "
                          f"{cfg.steps} (the step before the profiled ones warms the profiler "
                          f"up); pass --profile-steps {max(1, cfg.steps // 4)} or more --steps")
    if cfg.lr <= 0:
        raise ConfigError(f"--lr must be positive, got {cfg.lr}")
    for option in NON_NEGATIVE_FLOATS:
        if getattr(cfg, option) < 0:
            raise ConfigError(f"{_flag(option)} must be >= 0, got {getattr(cfg, option)}")
    if not 0.0 <= cfg.min_lr_ratio <= 1.0:
        raise ConfigError(f"--min-lr-ratio must be in [0, 1], got {cfg.min_lr_ratio}")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ConfigError(f"--dropout must be in [0, 1), got {cfg.dropout}")
    if cfg.attention_window <= 0:
        raise ConfigError(f"--attention-window must be positive, got {cfg.attention_window}; "
                          "pass the keys each query sees, e.g. --attention-window 256")
    if (cfg.attention_window != _defaults(cfg)["attention_window"]
            and cfg.attention != "sliding_window"):
        raise ConfigError(f"--attention-window is used only by --attention sliding_window, not "
                          f"{cfg.attention}; pass --attention sliding_window or drop the window")
    if cfg.dropout > 0 and cfg.attention != "sdpa":
        raise ConfigError(f"--dropout {cfg.dropout} needs --attention sdpa (the only one with "
                          "attention dropout); pass --dropout 0 or --attention sdpa")
    if not 0.0 < cfg.val_fraction < 1.0:
        raise ConfigError(f"--val-fraction must be in (0, 1), got {cfg.val_fraction}")
    parse_signals(cfg.preemption_signals)
    if cfg.pg_timeout < 0:
        raise ConfigError(f"--pg-timeout must be >= 0 seconds (0: torch's default), got "
                          f"{cfg.pg_timeout}")
    check_fault_tolerance(cfg)
    check_trackers(cfg.tracker, cfg.tensorboard, packages=False)
    check_data_options(cfg)
    check_lora_options(cfg)


FAULT_TOLERANCE = ("replica_groups", "replica_group", "lighthouse", "min_replicas",
                   "quorum_timeout")


def check_fault_tolerance(cfg: TrainConfig) -> None:
    """The replica groups' options in range, and set only with ``--fault-tolerant``."""
    if not cfg.fault_tolerant:
        defaults = _defaults(cfg)
        for option in FAULT_TOLERANCE:
            if getattr(cfg, option) != defaults[option]:
                raise ConfigError(f"{_flag(option)} applies only to --fault-tolerant; pass "
                                  f"--fault-tolerant or drop {_flag(option)}")
        return
    if cfg.replica_groups < 1:
        raise ConfigError(f"--replica-groups must be positive, got {cfg.replica_groups}")
    if not 0 <= cfg.replica_group < cfg.replica_groups:
        raise ConfigError(f"--replica-group {cfg.replica_group} is not one of the "
                          f"{cfg.replica_groups} replica groups; pass 0 to "
                          f"{cfg.replica_groups - 1}")
    if not 1 <= cfg.min_replicas <= cfg.replica_groups:
        raise ConfigError(f"--min-replicas {cfg.min_replicas} must be between 1 and the "
                          f"{cfg.replica_groups} replica groups (more could never commit a "
                          f"step); pass --min-replicas 1 to keep training with any group alive")
    if cfg.quorum_timeout <= 0:
        raise ConfigError(f"--quorum-timeout must be positive seconds, got {cfg.quorum_timeout}")
    lighthouse_address(cfg.lighthouse)


def check_lora_options(cfg: TrainConfig) -> None:
    """LoRA's options in range, and set only with ``--lora-rank`` (docs/finetuning.md)."""
    if cfg.lora_rank < 0:
        raise ConfigError(f"--lora-rank must be >= 0 (0: train every parameter), got "
                          f"{cfg.lora_rank}")
    if not 0.0 <= cfg.lora_dropout < 1.0:
        raise ConfigError(f"--lora-dropout must be in [0, 1), got {cfg.lora_dropout}")
    if cfg.lora_alpha <= 0:
        raise ConfigError(f"--lora-alpha must be positive, got {cfg.lora_alpha}")
    defaults = _defaults(cfg)
    for option in ("lora_alpha", "lora_dropout", "lora_targets"):
        if cfg.lora_rank == 0 and getattr(cfg, option) != defaults[option]:
            raise ConfigError(f"{_flag(option)} applies only to LoRA; pass --lora-rank R "
                              f"(e.g. 8) or drop {_flag(option)}")


def check_model_fit(cfg: TrainConfig, shape: ModelConfig) -> None:
    """``--seq-len`` within the model's context; the attention choice and dropout only for the
    built-in families (a model of another family defines its own layers)."""
    context = shape.max_seq_len
    if cfg.seq_len > context:
        raise ConfigError(f"--seq-len {cfg.seq_len} exceeds the {cfg.model} model's context "
                          f"of {context}; pass --seq-len <= {context}")
    check_lora_targets(cfg, shape)
    if cfg.model in MODEL_SIZES:
        return
    defaults = _defaults(cfg)
    for option in ("attention", "attention_window", "dropout"):
        if getattr(cfg, option) != defaults[option]:
            raise ConfigError(f"{_flag(option)} applies to the built-in models only; --model "
                              f"{cfg.model} defines its own layers, so drop {_flag(option)}")


def check_lora_targets(cfg: TrainConfig, shape: ModelConfig) -> None:
    """``--lora-targets`` name linear layers of the model, where they are known without
    building it: the built-in families' and a Llama-shaped ``hf:`` model's (Hugging Face's
    names). Other models are checked when the trainer builds them
    (:func:`trainers.models.lora.target_modules`)."""
    if not (cfg.lora_rank and cfg.lora_targets) or shape.family not in FAMILIES:
        return
    names = set(linear_sizes(shape)) if cfg.model in MODEL_SIZES else set(HF_LINEARS)
    unknown = [t for t in parse_targets(cfg.lora_targets) if t not in names]
    if unknown:
        raise ConfigError(f"--lora-targets {','.join(unknown)} matches no linear layer of the "
                          f"model; pass some of {','.join(sorted(names))}")


def check_job(cfg: TrainConfig, world_sizes: Sequence[int], name: str,
              shape: ModelConfig | None) -> None:
    """Trainer ``name`` serves every option set; its degrees and the batch split evenly at
    every world size in ``world_sizes``; and its own checks (the table of trainers) pass."""
    defaults = _defaults(cfg)
    for option, default in defaults.items():
        owners = serving(option)
        if owners and name not in owners and getattr(cfg, option) != default:
            raise ConfigError(f"{_flag(option)} is not served by trainers.{name}; use "
                              + " or ".join(f"trainers.{t}" for t in owners)
                              + f" or drop {_flag(option)}")
    if cfg.tp < 1 or cfg.pp < 1 or cfg.dp < 0:
        raise ConfigError(f"--tp and --pp must be >= 1 and --dp >= 0, got --tp {cfg.tp} "
                          f"--pp {cfg.pp} --dp {cfg.dp}")
    if not world_sizes:
        raise ConfigError("no world size given")
    check = trainer(name).check
    for world in world_sizes:
        for flag, degree in (("--tp", cfg.tp), ("--pp", cfg.pp)):
            if world % degree:
                raise ConfigError(f"{flag} {degree} does not divide the world size {world}; "
                                  f"pass a {flag} that divides the number of ranks")
        if world % (cfg.tp * cfg.pp):
            raise ConfigError(f"--pp {cfg.pp} x --tp {cfg.tp} = {cfg.pp * cfg.tp} does not divide "
                              f"the world size {world}; pick degrees whose product divides the "
                              "number of ranks")
        dp = cfg.dp_size(world)
        if dp * cfg.tp * cfg.pp != world:
            model = " x ".join(f"{flag} {n}" for flag, n in (("--pp", cfg.pp), ("--tp", cfg.tp))
                               if n > 1 or flag == "--tp" and cfg.pp == 1)
            raise ConfigError(f"--dp {cfg.dp} x {model} != world size {world}; pass "
                              f"--dp {world // (cfg.tp * cfg.pp)} or --dp 0")
        replicas = cfg.replicas(world)
        if cfg.batch_size % (cfg.grad_accum * replicas):
            groups = f" ({cfg.replica_groups} replica groups of {dp})" if cfg.fault_tolerant else ""
            raise ConfigError(
                f"--batch-size {cfg.batch_size} is not divisible by --grad-accum {cfg.grad_accum} "
                f"x data-parallel size {replicas}{groups}; pass a multiple of "
                f"{cfg.grad_accum * replicas}")
        if check is not None:
            check(cfg, world, shape)


def check_locations(cfg: TrainConfig) -> list[RunPath]:
    """The run's URLs (``--output-dir``, ``--resume``, ``--data``, ``--tokenizer``) as paths,
    raising ConfigError for a scheme that is no storage or whose package is missing; reaches
    no server. Returns those on an object store."""
    named = [("--output-dir", cfg.output_dir), ("--data", cfg.data),
             ("--tokenizer", cfg.tokenizer)]
    if cfg.resume not in ("auto", "none"):
        named.append(("--resume", cfg.resume))
    found = [location(value, flag) for flag, value in named if value]
    if cfg.record_timeline and is_url(cfg.output_dir):
        raise ConfigError("--record-timeline appends to files in --output-dir, which an object "
                          "store cannot; pass a local --output-dir to record the timeline")
    return [path for path in found if is_remote(path)]


def check_stores(cfg: TrainConfig) -> None:
    """The object stores the run names can be reached with this environment's credentials,
    and ``--output-dir``'s written: what a submit checks, and never a dry run."""
    output = location(cfg.output_dir, "--output-dir")
    check_store(output, "--output-dir", write=True)
    for flag, value in (("--data", cfg.data), ("--tokenizer", cfg.tokenizer),
                        ("--resume", cfg.resume)):
        if value and value not in ("auto", "none") and is_url(value):
            check_store(location(value, flag), flag, write=False)
    if in_store(cfg.model):
        reason = store_reason(location(cfg.model[len(HF_PREFIX):], "--model"), write=False)
        if reason is not None:
            raise ConfigError(f"--model {cfg.model}: {reason}")


def check_paths(cfg: TrainConfig, shape: ModelConfig, reach_stores: bool = True) -> None:
    """The output directory can be written, the data fits the model, and ``--resume`` names a
    checkpoint of this model (or ``none`` finds none to overwrite), on this machine. Object
    stores (``s3://``) are reached only with ``reach_stores`` (:func:`check_stores`); without
    it every check that would read one is left to the submit (their schemes are still
    checked), and the checks of local paths run as ever."""
    if check_locations(cfg) and reach_stores:
        check_stores(cfg)

    def readable(*values: str) -> bool:
        return reach_stores or not any(is_url(value) for value in values)

    output = location(cfg.output_dir)
    if not is_remote(output):
        _check_writable(output)
    if readable(cfg.data, cfg.tokenizer, cfg.output_dir):  # a text cache is in --output-dir
        check_data(cfg, shape.vocab_size)
    if not readable(cfg.output_dir if cfg.resume in ("auto", "none") else cfg.resume):
        return
    if cfg.resume == "none":
        if find_checkpoints(output / "checkpoints"):
            raise ConfigError(f"--resume none, but {cfg.output_dir} already holds checkpoints; "
                              "pass --resume auto or a new --output-dir")
        return
    source = output if cfg.resume == "auto" else location(cfg.resume)
    if cfg.resume != "auto" and not find_checkpoints(source):
        raise MissingPathError(f"--resume {cfg.resume}: no checkpoint there; pass a run directory "
                               "holding checkpoints/step_*, a step_* directory, auto or none")
    manifest = saved_manifest(source)
    if manifest is None:
        return
    check_format(source, manifest)
    saved = manifest.get("model")
    if saved != cfg.model:
        raise ConfigError(f"{source} holds a --model {saved} checkpoint, not {cfg.model}; pass "
                          f"--model {saved}, another --output-dir or --resume none")


def _check_writable(path: Path) -> None:
    """Raise ConfigError unless ``path`` is, or can be created as, a writable directory
    (decided without writing: :func:`trainers.options.paths.unwritable_reason`)."""
    reason = unwritable_reason(path)
    if reason is not None:
        where, why = reason
        raise ConfigError(f"--output-dir {path}: {where} cannot be written ({why}); pass a "
                          "writable path")

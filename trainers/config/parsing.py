"""The command line of every trainer and its resolution: :class:`TrainConfig`
(:mod:`trainers.options.train_config`) parsed, checked and resolved.

Every field of :class:`TrainConfig` is a ``--flag`` (underscores become dashes) whose help text
is the field's ``help`` metadata. :func:`parse_config` is the single entry point used by the
trainers (at start-up) and by the TorchX components (before anything is scheduled), so a bad
argument gets the same one-line :class:`ConfigError` in both places: it parses, checks
(:mod:`trainers.config.checks`, which change nothing) and returns the config resolved
(:func:`resolve`: the values the defaults leave open, filled in). What differs between
trainers (the options they own, their own checks) comes from the table of trainers
(:mod:`trainers.options.trainer_table`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, get_type_hints

from trainers.config import checks as config_checks
from trainers.errors import ConfigError
from trainers.options.model_names import model_shape
from trainers.options.train_config import TrainConfig
from trainers.options.trainer_table import (
    check_tensor_parallel_inside_node,
    serving,
    trainer,
)
from trainers.sizing.shapes import ModelConfig


def _str2bool(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


class _Default(str):
    """An option's default as the parser holds it, told apart from a value given once."""


class _Repeatable(argparse.Action):
    """A comma-separated option that may also be given more than once: the values join with
    commas (``--tracker mlflow --tracker wandb`` is ``--tracker mlflow,wandb``)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        current = getattr(namespace, self.dest)
        setattr(namespace, self.dest,
                values if isinstance(current, _Default) else f"{current},{values}")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are raised as ConfigError, so that :func:`exit_on_config_error`
    reports them in a single ``prog: error: ...`` line. Options are never abbreviated (``--check
    5`` is not ``--checkpoint-every 5``): an unknown one is refused, naming the closest."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            closest = self.closest_option(message[len(prefix):].split()[0])
            if closest:
                message += (f"; did you mean {closest}? (`python -m {self.prog} --help` lists "
                            "the options)")
            else:
                message += f"; pass only options that `python -m {self.prog} --help` lists"
        raise ConfigError(message)

    def closest_option(self, given: str) -> str | None:
        """The option ``given`` (an unknown argument) most likely meant: the one it abbreviates
        (several: all of them), else the most similar spelling; None for no option or none
        close."""
        if not given.startswith("--"):
            return None
        name = given.split("=", 1)[0]
        options = [o for o in self._option_string_actions if o.startswith("--")]
        started = sorted(o for o in options if o.startswith(name))
        if started:
            return " or ".join(started)
        close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
        return close[0] if close else None


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's help with its default, except an empty one (nothing to show)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default == "":
            return action.help
        return super()._get_help_string(action)


def build_parser(name: str) -> argparse.ArgumentParser:
    """The parser of trainer ``name``: every :class:`TrainConfig` field, with ``--help`` from
    its metadata. ``--help`` lists the options this trainer serves, those every trainer serves
    first, then its own; those only other trainers serve are still parsed (so that passing one
    gets the one-line error naming the trainer that serves it) but hidden."""
    entry = trainer(name)
    parser = OneLineParser(prog=entry.module, description=f"{entry.summary}. {entry.when}",
                           formatter_class=_HelpFormatter)
    groups = {"shared": parser.add_argument_group("options of every trainer"),
              "own": parser.add_argument_group(f"options of {entry.module}")}
    hints = get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        kind = hints[f.name]
        owners = serving(f.name)
        shown = not owners or name in owners
        group = groups["own" if owners else "shared"]
        kwargs: dict[str, Any] = {"default": f.default,
                                  "help": f.metadata["help"] if shown else argparse.SUPPRESS,
                                  "type": _str2bool if kind is bool else kind}
        if f.name == "output_dir":
            kwargs["default"] = str(Path("outputs") / name)
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        if f.metadata.get("repeatable"):
            kwargs.update(action=_Repeatable, default=_Default(f.default))
        if kind is bool:
            kwargs["nargs"] = "?"
            kwargs["const"] = True
            kwargs["metavar"] = "BOOL"
        flag = "--" + f.name.replace("_", "-")
        group.add_argument(flag, **kwargs)
        if f.metadata.get("negatable"):
            group.add_argument("--no-" + flag[2:], dest=f.name, action="store_false",
                                default=argparse.SUPPRESS,
                                help=f"same as {flag} false" if shown else argparse.SUPPRESS)
    return parser


def resolve(cfg: TrainConfig, name: str, shape: ModelConfig | None) -> TrainConfig:
    """A copy of ``cfg`` with what its defaults leave open filled in: ``--seq-len 0`` becomes
    the context of the model of ``shape`` (unknown: left 0), an empty ``--output-dir``
    ``outputs/<name>``."""
    seq_len = cfg.seq_len or (shape.max_seq_len if shape is not None else 0)
    return dataclasses.replace(cfg, seq_len=seq_len,
                               output_dir=cfg.output_dir or str(Path("outputs") / name))


def validate(cfg: TrainConfig, world_sizes: Sequence[int], name: str,
             check_paths: bool = True, reach_stores: bool = True) -> TrainConfig:
    """``cfg`` resolved (:func:`resolve`) for trainer ``name`` after every check of
    :mod:`trainers.config.checks` at every world size the job may run at; ``cfg``
    itself is left as given.

    ``check_paths`` also checks the data file, the output directory and ``--resume`` on this
    machine (a component submitting to a cluster may not see them); a model in files
    (``hf:DIR``, ``MODULE:ATTR``) is read only then. Object stores (``s3://``, also an
    ``hf:s3://`` model) are reached only with ``reach_stores`` too (a component leaves that to
    its scheduler's submit, so a dry run needs no bucket); without it just their scheme is
    checked, and the paths' checks that need the model's vocabulary wait for the bucket.

    Raises :class:`ConfigError` with a one-line message naming the fix.
    """
    config_checks.check_options(cfg)
    shape = model_shape(cfg.model, load=check_paths, reach_stores=reach_stores)
    if shape is not None:
        config_checks.check_model_fit(cfg, shape)
    resolved = resolve(cfg, name, shape)
    config_checks.check_job(resolved, world_sizes, name, shape)
    if check_paths and shape is not None:
        config_checks.check_paths(resolved, shape, reach_stores)
    else:
        config_checks.check_locations(resolved)
    return resolved


def parse_config(argv: Sequence[str] | None, name: str,
                 world_sizes: Sequence[int] | None = None,
                 check_paths: bool = True, reach_stores: bool = True) -> TrainConfig:
    """Parse and validate the arguments of trainer ``name`` (an entry of the table of
    trainers, e.g. ``fsdp``).

    ``world_sizes`` lists the numbers of ranks the job may run at (a component passes every
    size its node range allows); by default it is this process's ``WORLD_SIZE``, and a
    tensor-parallel group is checked to stay inside this node (``LOCAL_WORLD_SIZE``).
    """
    namespace = build_parser(name).parse_args(list(sys.argv[1:] if argv is None else argv))
    cfg = TrainConfig(**{key: str(value) if isinstance(value, _Default) else value
                         for key, value in vars(namespace).items()})
    if world_sizes is not None:
        return validate(cfg, world_sizes, name, check_paths, reach_stores)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    resolved = validate(cfg, [world], name, check_paths, reach_stores)
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if per_node < world and "tp" in trainer(name).options:
        check_tensor_parallel_inside_node(resolved, per_node)
    return resolved


def split_at_dashes(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``argv`` before and after its first ``--`` (a launcher's options and the trainer's)."""
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    return argv[:split], argv[split + 1:]


def without_option(args: Sequence[str], *flags: str) -> list[str]:
    """``args`` less every ``FLAG VALUE`` and ``FLAG=VALUE`` of ``flags``."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif arg.split("=", 1)[0] not in flags:
            kept.append(arg)
    return kept


@contextlib.contextmanager
def exit_on_config_error(prog: str) -> Iterator[None]:
    """Turn a :class:`ConfigError` raised inside into one ``prog: error:`` line and exit 2."""
    try:
        yield
    except ConfigError as err:
        sys.stderr.write(f"{prog}: error: {err}\n")
        raise SystemExit(2) from None


def parse_or_exit(argv: Sequence[str] | None, name: str) -> TrainConfig:
    """:func:`parse_config` for a trainer's ``main``: a bad argument exits 2 with one line."""
    with exit_on_config_error(trainer(name).module):
        return parse_config(argv, name)

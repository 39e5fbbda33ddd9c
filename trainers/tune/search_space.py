"""The search space of ``python -m trainers.tune``, from its ``--search`` expressions.

An expression is ``OPTION=KIND:ARGS`` over one trainer option (its name without the dashes, as
in ``--search lr=loguniform:1e-4:1e-2``):

========================  ===========================================================
``loguniform:LO:HI``      a float drawn log-uniformly from [LO, HI] (0 < LO < HI)
``uniform:LO:HI``         a float drawn uniformly from [LO, HI] (LO < HI)
``randint:LO:HI``         an integer drawn uniformly from LO to HI, both included
``choice:A,B,...``        one of the values, drawn with equal chance
``grid:A,B,...``          every value, each in its own trial (Tune's grid search)
========================  ===========================================================

Each trial passes the drawn value to the trainer as ``--OPTION VALUE``. Nothing here imports
Ray: :func:`parse_axis` turns an expression into an :class:`Axis`, which ``trainers.tune``
hands to Ray Tune; :func:`check_search` checks a search before anything runs (for
``trainers.tune`` and for its component, at submit).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from trainers.config.parsing import build_parser, parse_config, without_option
from trainers.errors import ConfigError
from trainers.options.train_config import TrainConfig

KINDS = ("loguniform", "uniform", "randint", "choice", "grid")
# Options each trial's launcher sets itself: a search over them would be meaningless.
NOT_SEARCHABLE = ("output-dir", "resume")


@dataclass(frozen=True)
class Axis:
    """One searched option: ``option`` (without dashes), ``kind`` (one of :data:`KINDS`) and
    ``values``: (LO, HI) for the ranges, the listed values (as given) for choice and grid."""

    option: str
    kind: str
    values: tuple[str, ...]

    @property
    def flag(self) -> str:
        return f"--{self.option}"

    def extremes(self) -> list[str]:
        """The values the trainer's parser must accept for every draw to be valid, as a trial
        passes them: both ends of a range (floats for uniform and loguniform), every listed
        value."""
        if self.kind in ("uniform", "loguniform"):
            return [self.render(float(value)) for value in self.values]
        return list(self.values)

    def render(self, value: object) -> str:
        """``value`` (a draw) as the trainer's argument."""
        if self.kind == "randint":
            return str(int(value))  # type: ignore[call-overload]
        return value if isinstance(value, str) else repr(value)

    def text(self) -> str:
        """The expression, normalized (``lr=loguniform:0.0001:0.01``)."""
        separator = "," if self.kind in ("choice", "grid") else ":"
        return f"{self.option}={self.kind}:{separator.join(self.values)}"


def _number(text: str, expr: str, integer: bool) -> float:
    try:
        return int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"--search {expr}: {text!r} is not {kind}; write e.g. "
                          f"{'batch-size=randint:8:32' if integer else 'lr=loguniform:1e-4:1e-2'}"
                          ) from None


def parse_axis(expr: str) -> Axis:
    """The :class:`Axis` of ``expr``; ConfigError (one line, with an example) when it does not
    parse: no ``=``, an unknown kind, a range with other than two numbers or in the wrong
    order, a loguniform range reaching zero, an empty or repeated value list."""
    option, eq, spec = expr.partition("=")
    option = option.strip().removeprefix("--")
    kind, colon, args = spec.partition(":")
    if not eq or not option or not colon:
        raise ConfigError(f"--search {expr}: not OPTION=KIND:ARGS; write e.g. "
                          "lr=loguniform:1e-4:1e-2 or batch-size=choice:8,16")
    if kind not in KINDS:
        raise ConfigError(f"--search {expr}: unknown kind {kind!r}; pass one of "
                          f"{', '.join(KINDS)}")
    if option in NOT_SEARCHABLE:
        raise ConfigError(f"--search {expr}: --{option} is set by trainers.tune for each trial; "
                          "pick another option to search")
    if kind in ("choice", "grid"):
        values = tuple(v.strip() for v in args.split(","))
        if not all(values):
            raise ConfigError(f"--search {expr}: an empty value; pass them as "
                              f"{option}={kind}:A,B,C")
        if len(set(values)) != len(values):
            raise ConfigError(f"--search {expr}: a value is listed twice; drop the repeat")
        return Axis(option, kind, values)
    ends = args.split(":")
    if len(ends) != 2:
        raise ConfigError(f"--search {expr}: {kind} takes two numbers, LO:HI; write e.g. "
                          f"{option}={kind}:{'8:32' if kind == 'randint' else '1e-4:1e-2'}")
    low, high = (_number(end, expr, kind == "randint") for end in ends)
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        raise ConfigError(f"--search {expr}: the range must be finite with LO < HI; "
                          f"pass {option}={kind}:LO:HI")
    if kind == "loguniform" and low <= 0:
        raise ConfigError(f"--search {expr}: loguniform needs 0 < LO; pass uniform for a range "
                          "that reaches zero")
    return Axis(option, kind, (ends[0].strip(), ends[1].strip()))


def parse_space(exprs: Sequence[str]) -> list[Axis]:
    """The axes of ``exprs`` (at least one, each option once)."""
    if not exprs:
        raise ConfigError("nothing to search; pass --search OPTION=KIND:ARGS, e.g. "
                          "--search lr=loguniform:1e-4:1e-2")
    axes = [parse_axis(expr) for expr in exprs]
    seen: set[str] = set()
    for axis in axes:
        if axis.option in seen:
            raise ConfigError(f"--search {axis.option} is given twice; pass one expression per "
                              "option")
        seen.add(axis.option)
    return axes


def grid_size(axes: Sequence[Axis]) -> int:
    """Trials per sample: the product of the grids' sizes (1 without a grid)."""
    return math.prod(len(axis.values) for axis in axes if axis.kind == "grid")


def check_axes(axes: Sequence[Axis], trainer: str, trainer_args: Sequence[str],
               workers: int) -> None:
    """ConfigError (one line) for a searched option the trainer does not have, one also fixed
    in ``trainer_args``, or a value of the space the trainer's parser refuses with the fixed
    options (:meth:`Axis.extremes`) at ``workers`` ranks."""
    flags = build_parser(trainer)._option_string_actions  # noqa: SLF001 (argparse's table)
    fixed = {arg.split("=", 1)[0] for arg in trainer_args if arg.startswith("--")}
    for axis in axes:
        if axis.flag not in flags:
            raise ConfigError(f"--search {axis.text()}: python -m trainers.{trainer} has no "
                              f"{axis.flag}; pick one of its options (python -m "
                              f"trainers.{trainer} --help)")
        if axis.flag in fixed:
            raise ConfigError(f"--search {axis.text()}: {axis.flag} is also fixed after --; "
                              "drop one of them")
        for value in axis.extremes():
            try:
                parse_config([*trainer_args, axis.flag, value], trainer, world_sizes=[workers],
                             reach_stores=False, check_paths=False)
            except ConfigError as err:
                hint = (f"; a {axis.kind} range draws floats: search it with e.g. "
                        f"{axis.option}=randint:LO:HI or {axis.option}=choice:A,B"
                        if axis.kind in ("uniform", "loguniform") else "")
                raise ConfigError(f"--search {axis.text()}: {axis.flag} {value}: {err}{hint}"
                                  ) from None


@dataclass(frozen=True)
class SearchOptions:
    """How many trials, how many at once, and ASHA's ``grace_period`` (0: the first
    evaluation) and ``reduction_factor``."""

    trials: int
    max_concurrent: int
    grace_period: int
    reduction_factor: float


def check_search(exprs: Sequence[str], options: SearchOptions, trainer: str,
                 trainer_args: Sequence[str], workers: int,
                 cfg: TrainConfig) -> tuple[list[Axis], int]:
    """The axes of ``exprs`` and ASHA's grace period in steps, once the search is checked
    against trainer ``trainer``'s fixed ``trainer_args`` (parsed: ``cfg``) at ``workers``
    ranks; ConfigError (one line naming the fix) for anything that cannot run."""
    axes = parse_space(exprs)
    if options.trials < 1:
        raise ConfigError(f"--trials must be positive, got {options.trials}; pass 1 or more")
    if options.max_concurrent < 0:
        raise ConfigError(f"--max-concurrent must be >= 0, got {options.max_concurrent}; pass 0 "
                          "(no limit) or N")
    if not cfg.eval_every:
        raise ConfigError("--eval-every 0: a search ranks its trials by their eval loss; pass "
                          "--eval-every K after --")
    grace = options.grace_period or cfg.eval_every
    if not options.grace_period and grace > cfg.steps:
        raise ConfigError(f"--eval-every {cfg.eval_every} comes after the trial's {cfg.steps} "
                          "steps, so no trial is ever ranked; pass --eval-every K of at most "
                          f"{cfg.steps} after --")
    if not 0 < grace <= cfg.steps:
        raise ConfigError(f"--grace-period {options.grace_period} must be within the trial's "
                          f"{cfg.steps} steps; pass 1-{cfg.steps}, or 0 for --eval-every")
    if not 1 < options.reduction_factor < math.inf:
        raise ConfigError(f"--reduction-factor must be above 1, got "
                          f"{options.reduction_factor:g}; pass e.g. 2 or 3")
    check_axes(axes, trainer, without_option(trainer_args, "--output-dir"), workers)
    return axes, grace

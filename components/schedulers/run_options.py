"""Run options read strictly, for every scheduler this repository registers, on every path
options reach a scheduler by.

TorchX 0.7.0 drops a run option its scheduler does not declare (``-cfg partiton=gpu`` passes
with exit 0 and the default partition; so does ``cfg={"log_dirr": ...}`` given to the Python
runner, and a misspelt key in a ``.torchxconfig`` is only a warning) and reads any ``-cfg`` bool
other than ``true`` as False. Each of our schedulers returns its options as
:class:`CheckedRunopts` (:func:`checked`), which refuses, in one line naming the fix, an unknown
option (with the closest valid one) and a value of the wrong type:

* in ``cfg_from_str`` (``torchx run -cfg key=value,...``): a bool other than True or False,
  an int or float that does not parse, KEY:VALUE items without a colon;
* in ``resolve``, which TorchX's runner and every scheduler's ``submit_dryrun`` call with the
  options as a dict (``Runner.dryrun_component(..., cfg=...)``): a value that is not of the
  option's type;
* in ``check_text``, which ``torchx run`` (components/cli.py) calls on each option of the
  scheduler's section of a ``.torchxconfig`` before TorchX reads it: what TorchX's loader would
  warn about and drop, or end in a traceback on.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any, get_origin

from torchx.specs import CfgVal, runopts
from torchx.specs.api import get_type_name, runopt
from torchx.util.types import to_dict

from components.errors import ComponentArgumentError

_BOOLS = {"true", "false"}


class CheckedRunopts(runopts):
    """TorchX's run options of scheduler ``scheduler``, with strict ``cfg_from_str`` and
    ``resolve``."""

    def __init__(self, scheduler: str) -> None:
        super().__init__()
        self.scheduler = scheduler

    def cfg_from_str(self, cfg_str: str) -> dict[str, CfgVal]:
        for key, value in to_dict(cfg_str).items():
            self.check(key, value)
        return super().cfg_from_str(cfg_str)

    def resolve(self, cfg: Mapping[str, CfgVal], **kwargs: Any) -> dict[str, CfgVal]:
        """TorchX's ``resolve`` (defaults filled in), once every option of ``cfg`` is known
        (unless TorchX main's ``ignore_unknown``) and of its option's type (or None)."""
        for key, value in cfg.items():
            given = f"run option {key}={value!r}"
            opt = self.get(key) if kwargs.get("ignore_unknown") else self.option(key, given)
            if opt is not None and value is not None and not runopts.is_type(value, opt.opt_type):
                raise ComponentArgumentError(
                    f"{self.scheduler}: {given} is not {_a(opt.opt_type)}; pass "
                    f"{_example(key, opt.opt_type, '=', python=True)}")
        return super().resolve(cfg, **kwargs)

    def check(self, key: str, value: str) -> None:
        """Raise ComponentArgumentError unless ``key`` is an option and ``value`` parses."""
        self.check_text(key, value, f"-cfg {key}={value}", _BOOLS.__contains__, "=")

    def check_text(self, key: str, value: str, given: str, is_bool: Callable[[str], bool],
                   assign: str) -> None:
        """Raise ComponentArgumentError, its message starting with ``given`` (how the user
        wrote the option), unless ``key`` is an option and its text ``value`` parses: a bool
        (``is_bool`` of the lower-cased value), an int, a float, or KEY:VALUE items."""
        kind = self.option(key, given).opt_type
        if not _parses(kind, value, is_bool):
            raise ComponentArgumentError(f"{self.scheduler}: {given} is not {_a(kind)}; pass "
                                         f"{_example(key, kind, assign)}")

    def option(self, key: str, given: str) -> runopt:
        """Option ``key``; ComponentArgumentError naming the closest option when there is none
        (``given``: how the user wrote it)."""
        opt = self.get(key)
        if opt is None:
            names = [name for name, _ in self]
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
            hint = (f"did you mean {close[0]}?" if close
                    else f"pass one of {', '.join(sorted(names))}")
            raise ComponentArgumentError(
                f"{self.scheduler}: {given}: {self.scheduler} has no run option {key}; {hint} "
                f"(`torchx runopts {self.scheduler}` lists them)")
        return opt


def _parses(kind: type, value: str, is_bool: Callable[[str], bool]) -> bool:
    """Whether ``value`` is the text of an option of type ``kind``: a bool (``is_bool`` of the
    lower-cased value), an int, a float, or KEY:VALUE items (as TorchX splits them)."""
    if kind is bool:
        return is_bool(value.lower())
    if kind in (int, float):
        try:
            kind(value)
        except ValueError:
            return False
        return True
    items = value.replace(";", ",").split(",")
    return get_origin(kind) is not dict or all(":" in item for item in items if item)


def _a(kind: type) -> str:
    """"a bool", "an int", "a list of str", "KEY:VALUE items" for an option of type ``kind``."""
    if get_origin(kind) is dict:
        return "KEY:VALUE items"
    name = "list of str" if get_origin(kind) is list else get_type_name(kind)
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


# An example value of an option by its type: as text (-cfg, .torchxconfig) and in Python.
_EXAMPLES = {int: ("1", "1"), float: ("1.0", "1.0"), str: ("TEXT", "'TEXT'"),
             list: ("A;B", "['A', 'B']"), dict: ("KEY:VALUE;KEY2:VALUE2", "{'KEY': 'VALUE'}")}


def _example(key: str, kind: type, assign: str, python: bool = False) -> str:
    """How to give option ``key`` of type ``kind`` right: as text (``assign``: ``-cfg``'s ``=``
    or a .torchxconfig's `` = ``) or as a Python value (``python``)."""
    if kind is bool:
        return f"{key}{assign}True or {key}{assign}False"
    example = _EXAMPLES.get(get_origin(kind) or kind, _EXAMPLES[str])[python]
    return f"e.g. {key}{assign}{example}"


def checked(opts: runopts, scheduler: str) -> CheckedRunopts:
    """``opts`` (a scheduler's run options) as :class:`CheckedRunopts`."""
    strict = CheckedRunopts(scheduler)
    strict.update(opts)
    return strict


class StrictRunOptions:
    """Mixin for a TorchX scheduler class: its run options are :class:`CheckedRunopts`, named
    by ``registered_as`` (the scheduler's name in pyproject.toml's table) in their errors."""

    registered_as: str

    def run_opts(self) -> runopts:
        return checked(super().run_opts(), self.registered_as)  # type: ignore[misc]

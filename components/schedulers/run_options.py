"""Run options (``-cfg key=value,...``) read strictly, for every scheduler this repository
registers.

TorchX 0.7.0 drops a ``-cfg`` key its scheduler does not declare (``partiton=gpu`` passes with
exit 0 and the default partition) and reads any bool other than ``true`` as False. Each of our
schedulers returns its options as :class:`CheckedRunopts` (:func:`checked`), whose
``cfg_from_str`` refuses, in one line naming the fix, an unknown key (with the closest valid
one), and a bool, int or float value that does not parse.
"""

from __future__ import annotations

import difflib

from torchx.specs import CfgVal, runopts
from torchx.util.types import to_dict

from components.errors import ComponentArgumentError

_BOOLS = {"true", "false"}


class CheckedRunopts(runopts):
    """TorchX's run options of scheduler ``scheduler``, with strict ``cfg_from_str``."""

    def __init__(self, scheduler: str) -> None:
        super().__init__()
        self.scheduler = scheduler

    def cfg_from_str(self, cfg_str: str) -> dict[str, CfgVal]:
        for key, value in to_dict(cfg_str).items():
            self.check(key, value)
        return super().cfg_from_str(cfg_str)

    def check(self, key: str, value: str) -> None:
        """Raise ComponentArgumentError unless ``key`` is an option and ``value`` parses."""
        opt = self.get(key)
        if opt is None:
            names = [name for name, _ in self]
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
            hint = (f"did you mean {close[0]}?" if close
                    else f"pass one of {', '.join(sorted(names))}")
            raise ComponentArgumentError(
                f"{self.scheduler}: -cfg {key}={value}: {self.scheduler} has no run option "
                f"{key}; {hint} (`torchx runopts {self.scheduler}` lists them)")
        kind = opt.opt_type
        if kind is bool and value.lower() not in _BOOLS:
            raise ComponentArgumentError(
                f"{self.scheduler}: -cfg {key}={value} is not a bool; pass {key}=True or "
                f"{key}=False")
        if kind in (int, float):
            try:
                kind(value)
            except ValueError:
                raise ComponentArgumentError(
                    f"{self.scheduler}: -cfg {key}={value} is not a{'n' if kind is int else ''} "
                    f"{kind.__name__}; pass e.g. {key}={kind(1)}") from None


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

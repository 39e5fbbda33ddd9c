"""``torchx run`` as this repository installs it (the ``torchx.cli.cmds`` entry point ``run``).

TorchX's own command, with three differences:

* Without ``-s`` (and no ``scheduler`` in a ``.torchxconfig``'s ``[cli:run]``) it runs on
  :data:`DEFAULT_SCHEDULER`, wherever it is started: TorchX would take the first scheduler in
  its table, which is whichever registered name sorts first (``aws_batch`` or ``kubernetes``).
* The launch options of this repository's components are read strictly before TorchX parses
  them: a bool that is not True/False, a dict item without ``=``, or an option the component
  does not have (most often a trainer option given before the ``--``) is one line naming the
  fix, where TorchX would turn the bool off, print a traceback or a usage dump.
* A :class:`~components.errors.ComponentArgumentError` raised where TorchX does not catch it
  (e.g. while reading ``-cfg`` run options) is printed as TorchX prints a component's error:
  one line, exit 1, nothing scheduled.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from torchx.cli import cmd_run
from torchx.runner import config
from torchx.util.types import to_dict

from components.errors import ComponentArgumentError

DEFAULT_SCHEDULER = "local_cwd"
_COMPONENTS_DIR = Path(__file__).resolve().parent
_TRUE_FALSE = {"true", "false"}

logger = logging.getLogger(__name__)


def _our_component(name: str) -> Callable[..., object] | None:
    """The component function ``name`` (``path/to/file.py:fn`` or ``module.fn``) names when it
    is one of this repository's, else None (TorchX reports what it cannot find itself)."""
    from torchx.specs.finder import get_component

    path, _, _ = name.rpartition(":")
    ours = (Path(path).resolve().parent == _COMPONENTS_DIR if path.endswith(".py")
            else name.startswith(f"{__package__}."))
    if not ours:
        return None
    try:
        return get_component(name).fn
    except Exception:  # noqa: BLE001 (TorchX's own lookup reports the error in its words)
        return None


def check_component_args(name: str, fn: Callable[..., object], args: list[str]) -> None:
    """Raise ComponentArgumentError for a launch option of component ``fn`` (its arguments
    ``args`` before the ``--``) that TorchX would misread or refuse without naming the fix."""
    params = inspect.signature(fn).parameters
    options = {f"--{p}": p for p in params} | {f"-{p}": p for p in params if len(p) == 1}
    short = name.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--" or not token.startswith("-"):
            return  # the trainer's arguments (TorchX passes a bare first word through too)
        flag, eq, inline = token.partition("=")
        if flag == "--help":
            return
        if flag not in options:
            close = difflib.get_close_matches(flag, list(options), n=1)
            hint = (f"did you mean {close[0]}?" if close else
                    f"trainer options go after --, e.g. torchx run {name} -j 1x2 -- {token} ...")
            raise ComponentArgumentError(f"{short}: {token} is not an option of the component; "
                                         f"{hint}")
        value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
        i += 1 if eq else 2
        if value is None:
            return  # argparse says that a value is missing
        annotation = params[options[flag]].annotation
        _check_value(short, flag, value, str(annotation))


def _check_value(component: str, flag: str, value: str, annotation: str) -> None:
    if annotation in ("bool", "<class 'bool'>") and value.lower() not in _TRUE_FALSE:
        raise ComponentArgumentError(f"{component}: {flag} {value}: not a bool; pass "
                                     f"{flag} True or {flag} False")
    if "Dict" in annotation or "dict" in annotation:
        try:
            to_dict(value)
        except ValueError:
            raise ComponentArgumentError(
                f"{component}: {flag} {value}: not KEY=VALUE; pass {flag} KEY=VALUE[,KEY=VALUE"
                f"...], e.g. {flag} OMP_NUM_THREADS=1,NCCL_DEBUG=WARN") from None


class CmdRun(cmd_run.CmdRun):
    """``torchx run`` with this repository's default scheduler and checks (module docstring)."""

    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        super().add_arguments(subparser)
        configured = config.get_configs(prefix="cli", name="run").get("scheduler")
        subparser.set_defaults(scheduler=configured or DEFAULT_SCHEDULER)

    def run(self, args: argparse.Namespace) -> None:
        words = list(args.component_name_and_args or [])
        component = words[0] if words else ""
        try:
            fn = _our_component(component) if component else None
            if fn is not None:
                check_component_args(component, fn, words[1:])
            super().run(args)
        except ComponentArgumentError as err:
            # the two lines TorchX prints for a component's ComponentValidationException
            logging.getLogger(cmd_run.__name__).error(
                f"\nFailed to run component `{component}` got errors: \n {err}")
            sys.exit(1)

"""``torchx run`` as this repository installs it (the ``torchx.cli.cmds`` entry point ``run``).

TorchX's own command, with four differences:

* Without ``-s`` (and no ``scheduler`` in a ``.torchxconfig``'s ``[cli:run]``) it runs on
  :data:`DEFAULT_SCHEDULER`, wherever it is started: TorchX would take the first scheduler in
  its table, which is whichever registered name sorts first (``aws_batch`` or ``kubernetes``).
* The launch options of this repository's components are read strictly before TorchX parses
  them: a bool that is not True/False, a dict item without ``=``, or an option the component
  does not have (most often a trainer option given before the ``--``) is one line naming the
  fix, where TorchX would turn the bool off, print a traceback or a usage dump.
* The scheduler's section of the ``.torchxconfig`` files it reads (TorchX's ``find_configs``:
  ``$TORCHXCONFIG``, else ``~`` and the working directory) is checked first
  (:func:`check_torchxconfig`): an option the scheduler does not have, or whose value does not
  parse, is one line naming the file, the section, the key and the fix, where TorchX would
  warn and drop the option, or print a traceback. (A file that is not INI at all fails earlier,
  in TorchX's own reading of its ``[cli:...]`` sections while it builds its argument parsers.)
* A :class:`~components.errors.ComponentArgumentError` raised where TorchX does not catch it
  (e.g. while reading ``-cfg`` run options) is printed as TorchX prints a component's error:
  one line, exit 1, nothing scheduled.
"""

from __future__ import annotations

import argparse
import configparser
import difflib
import importlib
import inspect
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from torchx.cli import cmd_run
from torchx.runner import config
from torchx.schedulers import get_scheduler_factories
from torchx.util.types import to_dict

from components.errors import ComponentArgumentError
from components.schedulers.run_options import CheckedRunopts

DEFAULT_SCHEDULER = "local_cwd"
_COMPONENTS_DIR = Path(__file__).resolve().parent
_TRUE_FALSE = {"true", "false"}

logger = logging.getLogger(__name__)


def _our_component(name: str) -> Callable[..., object] | None:
    """The component function ``name`` names when it is one of this repository's, else None
    (TorchX reports what it cannot find itself): ``path/to/components/<file>.py:fn``,
    ``components.<file>.fn``, or a builtin name ``<file>`` (pyproject.toml registers each module
    of ours without a prefix, and each holds the component of its own name). It is imported as
    the package's module, not looked up through TorchX's finder, which scans every installed
    distribution's entry points and which TorchX runs again itself."""
    path, _, fn_name = name.rpartition(":")
    if path.endswith(".py"):
        file = Path(path).resolve()
        module = f"{__package__}.{file.stem}" if file.parent == _COMPONENTS_DIR else None
    elif "." not in name and ":" not in name:
        module, fn_name = f"{__package__}.{name}", name
    else:
        module, _, fn_name = name.rpartition(".")
        module = module if module.startswith(f"{__package__}.") else None
    if module is None:
        return None
    try:
        fn = getattr(importlib.import_module(module), fn_name)
    except Exception:  # noqa: BLE001 (TorchX's own lookup reports the error in its words)
        return None
    return fn if callable(fn) else None


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


def _section(path: str, name: str) -> list[tuple[str, str]]:
    """The options of section ``name`` of the .torchxconfig at ``path`` (none without one), as
    TorchX reads them (keys keep their case, ``%(key)s`` interpolated); ComponentArgumentError
    (one line) for a file TorchX cannot read."""
    parser = configparser.ConfigParser()
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        parser.read(path)
        return parser.items(name) if parser.has_section(name) else []
    except configparser.Error as err:
        raise ComponentArgumentError(
            f"{path}: TorchX cannot read it ({' '.join(str(err).split())}); fix it as "
            "https://pytorch.org/torchx/latest/runner.config.html shows") from None


def check_torchxconfig(scheduler: str) -> None:
    """Raise ComponentArgumentError (one line naming the file, section, key and the fix) for an
    option in the ``[scheduler]`` section of a ``.torchxconfig`` that the scheduler does not
    have or whose value does not parse (:meth:`CheckedRunopts.check_text`, with the bool words
    of an INI file, which TorchX's loader reads). Options of schedulers whose run options are
    not :class:`CheckedRunopts` are TorchX's to read."""
    sections = {path: _section(path, scheduler) for path in config.find_configs()}
    if not any(sections.values()):
        return
    factory = get_scheduler_factories().get(scheduler)
    if factory is None:
        return
    try:
        opts = factory("torchx").run_opts()
    except ImportError:
        return  # a TorchX scheduler whose module is missing: TorchX says so when it runs
    if not isinstance(opts, CheckedRunopts):
        return
    for path, items in sections.items():
        for key, value in items:
            if value != "None":  # TorchX reads the word None as the option unset
                opts.check_text(key, value, f"{path} [{scheduler}] {key} = {value}",
                                configparser.ConfigParser.BOOLEAN_STATES.__contains__, " = ")


class CmdRun(cmd_run.CmdRun):
    """``torchx run`` with this repository's default scheduler and checks (module docstring)."""

    def add_arguments(self, subparser: argparse.ArgumentParser) -> None:
        super().add_arguments(subparser)
        subparser.allow_abbrev = False  # `--dry` is not `--dryrun`: unknown, so refused
        configured = config.get_configs(prefix="cli", name="run").get("scheduler")
        subparser.set_defaults(scheduler=configured or DEFAULT_SCHEDULER)

    def run(self, args: argparse.Namespace) -> None:
        words = list(args.component_name_and_args or [])
        component = words[0] if words else ""
        try:
            check_torchxconfig(args.scheduler)
            fn = _our_component(component) if component else None
            if fn is not None:
                check_component_args(component, fn, words[1:])
            super().run(args)
        except ComponentArgumentError as err:
            # the two lines TorchX prints for a component's ComponentValidationException
            logging.getLogger(cmd_run.__name__).error(
                f"\nFailed to run component `{component}` got errors: \n {err}")
            sys.exit(1)

"""Every use of a name TorchX keeps private is in components/schedulers/torchx_workarounds/: no
other module of the repository imports from a private TorchX module, imports a ``_`` name from
TorchX, or reads or calls one (an attribute or a ``getattr`` string naming something TorchX
defines with a leading ``_``). The methods TorchX's Scheduler API asks implementers to override
(``_submit_dryrun``, ``_validate``, ...) are its public contract, not private names."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest
import torchx
from torchx.schedulers.api import Scheduler

from tests.support.runs import REPO

WORKAROUNDS = REPO / "components" / "schedulers" / "torchx_workarounds"
MODULES = sorted(p for folder in ("components", "trainers") for p in (REPO / folder).rglob("*.py")
                 if WORKAROUNDS not in p.parents)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined(tree: ast.AST) -> set[str]:
    """The names ``tree`` defines: functions, classes, assigned names and attributes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


@cache
def torchx_private_names() -> frozenset[str]:
    """What TorchX defines with a leading ``_``, less its Scheduler API for implementers."""
    names = set()
    for path in Path(torchx.__file__).parent.rglob("*.py"):
        names |= {n for n in _defined(ast.parse(path.read_text())) if _private(n)}
    implementer_api = {n for n in vars(Scheduler) if _private(n)}
    return frozenset(names - implementer_api)


@cache
def repository_names() -> frozenset[str]:
    """What the repository's own modules define (a ``_`` helper of ours is not TorchX's)."""
    return frozenset(n for p in MODULES for n in _defined(ast.parse(p.read_text())))


def torchx_private_uses(source: str) -> list[str]:
    """The places in ``source`` that use a name TorchX keeps private, as ``line: name``."""
    private = torchx_private_names() - repository_names()
    uses = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torchx":
            names = [a.name for a in node.names if _private(a.name)]
            if any(_private(part) for part in node.module.split(".")):
                names.append(node.module)
            uses += [f"{node.lineno}: {n}" for n in names]
        elif isinstance(node, ast.Attribute) and node.attr in private:
            uses.append(f"{node.lineno}: {node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in {"getattr", "setattr", "hasattr"} and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in private):
            uses.append(f"{node.lineno}: {node.args[1].value}")
    return uses


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_outside_the_workarounds_uses_a_private_torchx_name(path: Path):
    assert torchx_private_uses(path.read_text()) == []


@pytest.mark.parametrize("source", [
    "from torchx.schedulers import slurm_scheduler\nslurm_scheduler._save_job_dir('1', 'd')\n",
    "def f(scheduler):\n    return scheduler._apps\n",
    "def f(info):\n    return getattr(info, '_app', None)\n",
    "from torchx.schedulers.slurm_scheduler import _get_job_dirs\n",
], ids=["module-function", "attribute", "getattr", "import"])
def test_each_kind_of_use_is_found(source: str):
    assert torchx_private_uses(source)


def test_the_workarounds_hold_the_uses_the_schedulers_need():
    """The folder is where the uses went, not a folder that lost them."""
    uses = {p.name: torchx_private_uses(p.read_text()) for p in WORKAROUNDS.glob("*.py")}
    assert all(uses[name] for name in ("local.py", "local_docker.py", "slurm.py", "k8s.py",
                                       "releases.py")), uses


def test_overriding_the_scheduler_api_for_implementers_is_not_a_private_use():
    source = ("class S:\n    def _submit_dryrun(self, app, cfg):\n"
              "        return super()._submit_dryrun(app, cfg)\n")
    assert torchx_private_uses(source) == []

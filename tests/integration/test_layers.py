"""The layers stay what the folders say: imports point one way, trainers/torchfree imports no torch,
no module hides a standard-library or dependency module, and the table of trainers is whole."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.runs import REPO, child_env
from trainers.torchfree.trainer_table import TRAINERS

# Layers from the bottom up; a module may import its own layer and the ones below it.
# trainers.models (the model protocol, registry and families) sits under core and parallel,
# which build models from it; it imports only torch and the torch-free layer.
LAYERS = ["trainers.torchfree", "trainers.models", "trainers.core", "trainers.parallel",
          "trainers"]


def _layer(module: str) -> int:
    for index, prefix in enumerate(LAYERS[:-1]):
        if module == prefix or module.startswith(prefix + "."):
            return index
    return len(LAYERS) - 1


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n for n in names if n == "trainers" or n.startswith("trainers.")}


@pytest.mark.parametrize("path", sorted((REPO / "trainers").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_imports_point_down(path: Path):
    module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
    upward = [name for name in _imports(path) if _layer(name) > _layer(module)]
    assert not upward, f"{module} imports from a layer above it: {upward}"


def test_the_model_protocol_is_a_leaf_and_no_family_is_imported_by_the_registry():
    """Families import the protocol and the registry, which find them by name: no circle."""
    from trainers.models.registry import BUILTIN_FAMILIES

    models = REPO / "trainers" / "models"
    allowed = {"protocol.py": set(), "registry.py": {"trainers.models.protocol"},
               "__init__.py": {f"trainers.models.{p.stem}" for p in models.glob("*.py")}
               - set(BUILTIN_FAMILIES.values())}
    for name, inside in allowed.items():
        imported = {n for n in _imports(models / name) if not n.startswith("trainers.torchfree")}
        assert imported <= inside, f"trainers/models/{name} imports {imported - inside}"


def test_the_spec_layer_and_the_components_import_no_torch():
    """What `torchx run` imports to validate and submit a job: no torch."""
    modules = [f"trainers.torchfree.{p.stem}" for p in (REPO / "trainers/torchfree").glob("*.py")]
    modules += [f"components.{name}" for name in TRAINERS] + ["components.launch"]
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env(), text=True,
                         capture_output=True, check=True).stdout
    assert out.strip() == "[]"


def _repo_modules() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split()
    return [REPO / p for p in tracked] + list((REPO / "trainers").rglob("*.py"))


def test_no_module_is_named_after_a_standard_library_or_dependency_module():
    """A python started in that folder would import ours instead (a module named tokenize in
    trainers/ broke `import inspect`; one named docker in components/schedulers/ broke the
    docker client)."""
    taken = set(sys.stdlib_module_names) | {"torch", "torchx", "docker", "kubernetes", "ray",
                                            "yaml", "numpy", "tensorboard", "pytest",
                                            "tokenizers", "pyarrow"}
    clashes = sorted({str(p.relative_to(REPO)) for p in _repo_modules() if p.stem in taken})
    assert not clashes


def test_torchx_imports_from_every_folder_of_the_repo():
    folders = sorted({p.parent for p in _repo_modules()} | {REPO / "k8s", REPO / "images",
                                                             REPO / "docs"})
    code = ("import torchx.schedulers, torchx.schedulers.docker_scheduler, "
            "torchx.schedulers.kubernetes_scheduler, inspect; "
            "from torchx.schedulers import get_scheduler_factories; "
            "print(sorted(get_scheduler_factories()))")
    for folder in folders:
        proc = subprocess.run([sys.executable, "-c", code], cwd=folder, env=child_env(), text=True,
                              capture_output=True)
        assert proc.returncode == 0, f"from {folder}: {proc.stderr.strip().splitlines()[-1:]}"


@pytest.mark.parametrize("name", list(TRAINERS))
def test_every_trainer_has_its_entry_module_and_component(name: str):
    entry = TRAINERS[name]
    module = importlib.import_module(entry.module)
    assert callable(module.build) and callable(module.main)
    path, _, function = entry.component.partition(":")
    component = importlib.import_module(Path(path).with_suffix("").as_posix().replace("/", "."))
    assert callable(getattr(component, function))

"""The layers stay what the contracts say: pyproject.toml's import contracts hold (and break on an
upward import), the torch-free layers and the components load no torch at run time, no module
hides a standard-library or dependency module, and the table of trainers is whole."""

from __future__ import annotations

import ast
import importlib
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.processes import run_command
from tests.support.runs import REPO
from trainers.options.trainer_table import TRAINERS

# The torch-free packages: what a component may import to check a job before submitting it.
# (trainers/errors.py besides.)
TORCH_FREE = ["runs", "sizing", "options", "formats", "config", "planning"]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n for n in names if n == "trainers" or n.startswith("trainers.")}


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    return run_command([str(LINT_IMPORTS), "--no-cache"], cwd=root, timeout=120)


def test_the_import_contracts_hold():
    proc = _lint_imports(REPO)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "0 broken" in proc.stdout


def test_an_upward_import_breaks_the_layers_contract(tmp_path: Path):
    """The contracts can fail: a torch-free module importing the training core breaks both the
    layers contract and the no-torch contract, each named."""
    for name in ("trainers", "components"):
        shutil.copytree(REPO / name, tmp_path / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    with (tmp_path / "trainers/options/paths.py").open("a") as f:
        f.write("\nfrom trainers.core import loop  # noqa: E402,F401\n")
    proc = _lint_imports(tmp_path)
    assert proc.returncode == 1
    assert "trainers.options is not allowed to import trainers.core" in proc.stdout
    assert "trainers: layers point down BROKEN" in proc.stdout


def test_the_model_protocol_is_a_leaf_and_no_family_is_imported_by_the_registry():
    """Families import the protocol and the registry, which find them by name: no circle."""
    from trainers.models.registry import BUILTIN_FAMILIES

    models = REPO / "trainers" / "models"
    allowed = {"protocol.py": set(), "registry.py": {"trainers.models.protocol"},
               "__init__.py": {f"trainers.models.{p.stem}" for p in models.glob("*.py")}
               - set(BUILTIN_FAMILIES.values())}
    for name, inside in allowed.items():
        imported = {n for n in _imports(models / name) if n.startswith("trainers.models")}
        assert imported <= inside, f"trainers/models/{name} imports {imported - inside}"


def test_the_torch_free_layers_and_a_component_dry_run_load_no_torch():
    """What `torchx run` imports to validate and submit a job, and a dry run through TorchX's
    runner in a fresh interpreter: no torch (a lazy import is not seen by lint-imports)."""
    modules = ["trainers.errors"] + [f"trainers.{package}.{p.stem}" for package in TORCH_FREE
                                     for p in (REPO / "trainers" / package).glob("*.py")]
    modules += [f"components.{name}" for name in TRAINERS] + ["components.launch"]
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            "from torchx.runner import get_runner\n"
            "info = get_runner().dryrun_component('ddp', ['-j', '1x2', '--', '--steps', '3'], "
            "'local_cwd', cfg={})\n"
            "assert 'trainers.ddp' in str(info.request)\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = run_command([sys.executable, "-c", code], check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def _repo_modules() -> list[Path]:
    tracked = run_command(["git", "ls-files", "*.py"], check=True).stdout.split()
    return [REPO / p for p in tracked] + list((REPO / "trainers").rglob("*.py"))


def test_no_module_is_named_after_a_standard_library_or_dependency_module():
    """A python started in that folder would import ours instead (a module named tokenize in
    trainers/ broke `import inspect`; one named docker in components/schedulers/ broke the
    docker client)."""
    taken = set(sys.stdlib_module_names) | {"torch", "torchx", "docker", "kubernetes", "ray",
                                            "yaml", "numpy", "tensorboard", "pytest",
                                            "tokenizers", "pyarrow"}
    names = {p: p.parent.name if p.name == "__init__.py" else p.stem for p in _repo_modules()}
    clashes = sorted({str(p.relative_to(REPO)) for p, name in names.items() if name in taken})
    assert not clashes


def test_torchx_imports_from_every_folder_of_the_repo():
    folders = sorted({p.parent for p in _repo_modules()} | {REPO / "k8s", REPO / "images",
                                                             REPO / "docs"})
    code = ("import torchx.schedulers, torchx.schedulers.docker_scheduler, "
            "torchx.schedulers.kubernetes_scheduler, inspect; "
            "from torchx.schedulers import get_scheduler_factories; "
            "print(sorted(get_scheduler_factories()))")

    def run_in(folder: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
        return folder, run_command([sys.executable, "-c", code], cwd=folder)

    # Two interpreters at a time: each folder's is independent of the others' (its own cwd).
    with ThreadPoolExecutor(2) as pool:
        for folder, proc in pool.map(run_in, folders):
            assert proc.returncode == 0, f"from {folder}: {proc.stderr.strip().splitlines()[-1:]}"


@pytest.mark.parametrize("name", list(TRAINERS))
def test_every_trainer_has_its_entry_module_and_component(name: str):
    entry = TRAINERS[name]
    module = importlib.import_module(entry.module)
    assert callable(module.build) and callable(module.main)
    path, _, function = entry.component.partition(":")
    component = importlib.import_module(Path(path).with_suffix("").as_posix().replace("/", "."))
    assert callable(getattr(component, function))

"""images/requirements.txt, the images' lock, is current: it pins every dependency the images
install from pyproject.toml (its dependencies, the extras images/lock names, its build
requirements) within pyproject's and constraints/cpu.txt's bounds, holds neither torch nor a CUDA
package, and carries the header images/lock writes for its settings; both Dockerfiles install
from it and end with `pip check`. Re-running the resolver takes the network; these checks read
files only, and fail when pyproject.toml gains or tightens a dependency without a new lock."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.runs import REPO

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

LOCK = REPO / "images" / "requirements.txt"
REGENERATE = "regenerate images/requirements.txt with images/lock (docs/images.md)"


def _lock_script() -> ModuleType:
    """images/lock (a script without .py) as a module, for its settings."""
    loader = importlib.machinery.SourceFileLoader("images_lock", str(REPO / "images" / "lock"))
    spec = importlib.util.spec_from_loader("images_lock", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


SCRIPT = _lock_script()
# The images' environment, for dependencies with markers: images/lock's Python on x86_64 Linux.
IMAGE_ENV = {"python_version": SCRIPT.PYTHON, "python_full_version": f"{SCRIPT.PYTHON}.0",
             "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
             "os_name": "posix", "implementation_name": "cpython",
             "platform_python_implementation": "CPython"}


def _pins() -> dict[str, Version]:
    """The lock's ``name==version`` lines by canonical name (annotations and comments skipped)."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        if not line or line[0] in "# -":
            continue
        name, version = line.split(";")[0].strip().split("==")
        pins[canonicalize_name(name)] = Version(version)
    return pins


def _image_requirements() -> list[Requirement]:
    """What the images install from pyproject.toml, torch (pinned per Dockerfile) excepted."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    lines = [*pyproject["project"]["dependencies"], *pyproject["build-system"]["requires"]]
    for extra in SCRIPT.EXTRAS:
        lines += pyproject["project"]["optional-dependencies"][extra]
    requirements = [Requirement(line) for line in lines]
    return [r for r in requirements if r.name not in SCRIPT.EXCLUDED
            and (r.marker is None or r.marker.evaluate(IMAGE_ENV))]


def test_lock_pins_every_dependency_the_images_install():
    pins = _pins()
    problems = []
    for req in _image_requirements():
        pinned = pins.get(canonicalize_name(req.name))
        if pinned is None:
            problems.append(f"{req} is not in the lock")
        elif not req.specifier.contains(pinned, prereleases=True):
            problems.append(f"{req}: the lock pins {pinned}")
    assert not problems, f"{'; '.join(problems)}: {REGENERATE}"


def test_lock_honours_the_constraints():
    pins = _pins()
    constraints = REPO / SCRIPT.CONSTRAINTS
    problems = []
    for line in constraints.read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        pinned = pins.get(canonicalize_name(req.name))
        if pinned is not None and not req.specifier.contains(pinned, prereleases=True):
            problems.append(f"{req}: the lock pins {pinned}")
    assert not problems, f"{'; '.join(problems)}: {REGENERATE}"


def test_lock_has_neither_torch_nor_cuda_packages():
    # torch is each Dockerfile's TORCH_SPEC; its CUDA build brings its CUDA libraries itself.
    names = set(_pins())
    assert not names & {canonicalize_name(n) for n in SCRIPT.EXCLUDED}
    assert not [n for n in names if SCRIPT.CUDA_PACKAGE.match(n)]


def test_lock_has_the_header_images_lock_writes():
    text = LOCK.read_text()
    uv_version = re.search(r"It runs, with (uv \S+):", text)
    assert uv_version, f"images/requirements.txt has no images/lock header: {REGENERATE}"
    header = SCRIPT.header(SCRIPT.compile_command("uv", None), uv_version[1])
    assert text.startswith(header), f"images/lock's settings changed since the lock: {REGENERATE}"
    assert "--no-emit-package torch" in header and "--torch-backend cpu" in header


@pytest.mark.parametrize("flavour", ["cpu", "cuda"])
def test_dockerfile_installs_the_lock_then_checks(flavour):
    dockerfile = (REPO / "images" / f"{flavour}.Dockerfile").read_text()
    assert "COPY images/requirements.txt /tmp/requirements.txt" in dockerfile
    assert '"$TORCH_SPEC" -r /tmp/requirements.txt' in dockerfile
    # CPU: the lock is complete for its torch, so pip installs it as it is (nothing else); CUDA:
    # pip resolves, for the CUDA libraries of torch's CUDA build.
    no_deps = "pip install --no-deps --find-links /tmp/wheels" in dockerfile
    assert no_deps == (flavour == "cpu")
    # the repository without resolving (nothing unpinned is fetched), then pip check
    assert re.search(r"RUN pip install --no-deps --no-build-isolation \. \\\n\s+&& pip check ",
                     dockerfile)

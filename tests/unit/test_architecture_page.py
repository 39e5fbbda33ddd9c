"""docs/architecture.md names every module of the code, and no docs page, docstring or comment
points at a file that does not exist."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from tests.support.processes import run_command
from tests.support.runs import REPO

PAGE = REPO / "docs" / "architecture.md"
# The folders whose modules the page describes, one table row each.
CODE = ("trainers", "components", "bench", "examples")
# What a reference to a file of this repository looks like: a path under one of its folders.
FOLDERS = ("trainers", "components", "bench", "examples", "docs", "tests", "k8s", "images",
           ".ci", ".github")
FOLDER = "|".join(re.escape(f) for f in FOLDERS)
REFERENCE = re.compile(rf"(?<![\w./-])((?:{FOLDER})/[\w./-]*\w\.(?:py|md|yml|yaml|json|toml))")


def modules() -> set[str]:
    return {str(p.relative_to(REPO)) for folder in CODE for p in (REPO / folder).rglob("*.py")
            if p.name != "__init__.py" and "__pycache__" not in p.parts}


def test_the_page_names_every_module_and_only_modules_that_exist():
    named = {m for m in REFERENCE.findall(PAGE.read_text()) if m.endswith(".py")
             and m.startswith(tuple(f"{f}/" for f in CODE))}
    assert sorted(modules() - named) == [], "modules docs/architecture.md does not name"
    assert sorted(named - modules()) == [], "modules docs/architecture.md names that do not exist"


SOURCES = sorted([*(p for f in (*CODE, "tests") for p in (REPO / f).rglob("*.py")
                    if "__pycache__" not in p.parts),
                  *(REPO / "docs").glob("*.md"), REPO / "README.md"])


def prose(source: Path) -> str:
    """A page's text; a module's docstrings and comments (its strings may name files that do
    not exist on purpose, e.g. a test's)."""
    text = source.read_text()
    if source.suffix != ".py":
        return text
    nodes = [n for n in ast.walk(ast.parse(text)) if isinstance(
        n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    docstrings = [ast.get_docstring(n) or "" for n in nodes]
    comments = [tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                if tok.type == tokenize.COMMENT]
    return "\n".join(docstrings + comments)


def written_by_a_run(ref: str) -> bool:
    """Whether ``ref`` is an output git ignores (e.g. a benchmark's quick results)."""
    return run_command(["git", "check-ignore", "-q", ref]).returncode == 0


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_references_point_at_files_that_exist(source: Path):
    missing = {ref for ref in REFERENCE.findall(prose(source))
               if "*" not in ref and not (REPO / ref).exists() and not written_by_a_run(ref)}
    assert sorted(missing) == []

"""The package's shape: imports run one way between the stage folders, no module imports a
private part of a dependency, no folder grows past a dozen modules (read from the source)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fnsysid"
#: the stage folders, top to bottom (README, Layout): a module imports only from its own
#: folder and the folders below it
ORDER = ["app", "runtimes", "results", "learning", "data", "dynamics", "config"]
PRIVATE = re.compile(r"^(hydra\._internal|omegaconf\._|omegaconf\.(base|nodes|grammar_parser))")


def _imports(path: Path) -> list[str]:
    """Every module an import statement of ``path`` names (lazy imports included)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (write fnsysid.<folder>.<module>)"
            names.append(node.module or "")
    return names


def _folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "fnsysid" and len(parts) > 1 and parts[1] in ORDER else None


@pytest.mark.slow
def test_imports_run_down_the_stages_and_never_into_private_modules():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = path.relative_to(PACKAGE).parts[0]
        for name in _imports(path):
            if PRIVATE.match(name):
                wrong.append(f"{path.relative_to(PACKAGE)} imports private {name}")
            there = _folder(name)
            if here in ORDER and there is not None and ORDER.index(there) < ORDER.index(here):
                wrong.append(f"{path.relative_to(PACKAGE)} ({here}) imports {name} ({there})")
    assert wrong == []


def test_every_folder_is_a_stage_of_at_most_twelve_modules():
    folders = sorted(p for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert [p.name for p in folders] == sorted(ORDER)
    for folder in folders:
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        assert 1 <= len(modules) <= 12, folder
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py"]


@pytest.mark.slow
def test_no_import_circle_between_modules():
    """Tarjan's strongly connected components of the module graph: none larger than one."""
    modules = {".".join(("fnsysid",) + p.relative_to(PACKAGE).with_suffix("").parts): p
               for p in PACKAGE.rglob("*.py")}
    modules = {m.removesuffix(".__init__"): p for m, p in modules.items()}
    graph = {m: {n for n in _imports(p) if n in modules and n != m} for m, p in modules.items()}
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    assert circles == []

"""The layers of the house, checked from the source (no import, no GPU): only the bindings (`fastnn/cuda/`) speak
ctypes; nothing under `fastnn/engine/` imports the user layer (trainer, control, distributed, sklearn); and no module
imports another module's private names (`from .x import _y`)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "fastnn"
MODULES = sorted(str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py"))

#: What the engines may not import: the user's words live above them.
USER_LAYER = ("fastnn.trainer", "fastnn.control", "fastnn.distributed", "fastnn.sklearn")

#: Private imports known to be on their way out, each with the change that removes it; the test fails once one is
#: gone, so this list cannot outlive them. checkpoint.py: one module for atomic file writes (issue 24, item 4).
KNOWN_PRIVATE_IMPORTS: set[tuple[str, str]] = set()


def _module_name(path: str) -> str:
    parts = Path(path).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(path: str) -> str:
    """The package a module's relative imports start from."""
    name = _module_name(path)
    return name if path.endswith("__init__.py") else name.rpartition(".")[0]


def _imports(path: str) -> Iterator[tuple[str, list[str]]]:
    """(absolute module, imported names) of every import in the file, lazy ones inside functions included."""
    tree = ast.parse((REPO / path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package(path).split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            yield module, [alias.name for alias in node.names]


@pytest.mark.parametrize("path", [p for p in MODULES if not p.startswith("fastnn/cuda/")])
def test_only_the_bindings_use_ctypes(path: str) -> None:
    assert not any(module.split(".")[0] == "ctypes" for module, _ in _imports(path)), path


@pytest.mark.parametrize("path", [p for p in MODULES if p.startswith("fastnn/engine/")])
def test_the_engines_do_not_import_the_user_layer(path: str) -> None:
    for module, names in _imports(path):
        targets = [module] + [f"{module}.{n}" for n in names]
        bad = [t for t in targets if any(t == u or t.startswith(u + ".") for u in USER_LAYER)]
        assert not bad, f"{path} imports {bad[0]}: move what it needs below the engines (fastnn.errors, engine/)"


def _private_imports(path: str) -> Iterator[str]:
    """`module.name` of each private name `path` imports from another module (private submodules, `from .. import
    _files`, are internal modules shared inside fastnn)."""
    for module, names in _imports(path):
        if not module.startswith("fastnn"):
            continue
        for name in names:
            private = name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
            # A private submodule (`from .. import _files`) is an internal module: fastnn's to share, not the user's.
            where = REPO / module.replace(".", "/") / name
            if private and module != _package(path) and not (where.with_suffix(".py").is_file() or where.is_dir()):
                yield f"{module}.{name}"


@pytest.mark.parametrize("path", MODULES)
def test_no_module_imports_another_modules_private_names(path: str) -> None:
    found = {(path, imported) for imported in _private_imports(path)}
    assert found <= KNOWN_PRIVATE_IMPORTS, f"{sorted(found - KNOWN_PRIVATE_IMPORTS)}: make the name public, or move it"


def test_the_known_private_imports_are_still_there() -> None:
    """Remove an entry of KNOWN_PRIVATE_IMPORTS once its import is gone."""
    for path, imported in KNOWN_PRIVATE_IMPORTS:
        assert imported in set(_private_imports(path)), f"{path} no longer imports {imported}: drop it from the list"


def test_the_checks_see_what_they_look_for(tmp_path, monkeypatch) -> None:
    """The three checks find a ctypes import, an engine importing the trainer lazily, and a private name imported
    across modules (relative imports resolved), and accept a package's own private submodule."""
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "fastnn" / "engine" / "graph").mkdir(parents=True)
    (tmp_path / "fastnn" / "engine" / "graph" / "x.py").write_text(
        "import ctypes\n"
        "from ... import errors\n"
        "from .. import _own\n"
        "from . import _mine\n"
        "from ..plan import _hidden\n"
        "def f():\n"
        "    from ...trainer import Trainer\n"
    )
    path = "fastnn/engine/graph/x.py"
    imports = list(_imports(path))
    assert ("ctypes", []) in imports and ("fastnn", ["errors"]) in imports
    assert ("fastnn.trainer", ["Trainer"]) in imports
    assert sorted(_private_imports(path)) == ["fastnn.engine._own", "fastnn.engine.plan._hidden"]
    with pytest.raises(AssertionError):
        test_only_the_bindings_use_ctypes(path)
    with pytest.raises(AssertionError, match="imports fastnn.trainer"):
        test_the_engines_do_not_import_the_user_layer(path)

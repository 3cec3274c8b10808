"""The layers of the house, checked from the source (no import, no GPU): only the bindings (`fastnn/cuda/`) speak
ctypes; nothing under `fastnn/engine/` imports the user layer (trainer, control, distributed, sklearn); no module
imports another module's private names (`from .x import _y`); and the examples use the public API only."""

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
USER_LAYER = (
    "fastnn._trainer", "fastnn._fit", "fastnn._saved", "fastnn._control", "fastnn.distributed", "fastnn.sklearn",
)  # fmt: skip

#: The public modules besides `fastnn` itself, with the names of theirs that are public (None: the module's
#: `__all__`). `fastnn.engine` is internal but for `Tuning`, an advanced argument of `Trainer`.
PUBLIC_MODULES: dict[str, tuple[str, ...] | None] = {
    "fastnn.datasets": None,
    "fastnn.schedules": None,
    "fastnn.sklearn": None,
    "fastnn.distributed": None,
    "fastnn.engine": ("Tuning",),
}
EXAMPLES = sorted(str(p.relative_to(REPO)) for p in (REPO / "examples").glob("*.py"))

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
        assert not bad, f"{path} imports {bad[0]}: move what it needs below the engines (fastnn._errors, engine/)"


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
        "    from ..._trainer import Trainer\n"
    )
    path = "fastnn/engine/graph/x.py"
    imports = list(_imports(path))
    assert ("ctypes", []) in imports and ("fastnn", ["errors"]) in imports
    assert ("fastnn._trainer", ["Trainer"]) in imports
    assert sorted(_private_imports(path)) == ["fastnn.engine._own", "fastnn.engine.plan._hidden"]
    with pytest.raises(AssertionError):
        test_only_the_bindings_use_ctypes(path)
    with pytest.raises(AssertionError, match="imports fastnn._trainer"):
        test_the_engines_do_not_import_the_user_layer(path)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `edges` (module -> modules it imports): each strongly connected set of two or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _package_imports(package: str) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports (type-checking and lazy imports included), for its modules."""
    mods = {_module_name(p): p for p in MODULES if _module_name(p).startswith(package + ".")}
    return {
        name: {t for module, names in _imports(path) for t in [module, *(f"{module}.{n}" for n in names)]
               if t in mods and t != name}
        for name, path in mods.items()
    }  # fmt: skip


def test_the_graph_engines_helpers_take_the_record_not_the_engine() -> None:
    """fastnn/engine/graph has no import circle, type-checking imports included: the helpers (step, kernels, plans,
    contexts, parallel, profile) take the narrow `Resources` record (resources.py), and only the engine's own
    module imports them, never the other way round."""
    edges = _package_imports("fastnn.engine.graph")
    assert "fastnn.engine.graph.resources" in edges  # the package was read
    assert _cycles(edges) == []
    engine = "fastnn.engine.graph.engine"
    assert sorted(m for m, deps in edges.items() if engine in deps) == []


def test_the_cycle_check_sees_what_it_looks_for() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set(), "c": {"c"}}) == []
    assert _cycles({"e": {"k", "s"}, "k": {"e"}, "s": {"e", "k"}, "p": {"e"}}) == [["e", "k", "s"]]


def _all(module: str) -> tuple[str, ...]:
    """`module`'s `__all__`, read from its source (a list or tuple of string literals)."""
    path = REPO / module.replace(".", "/")
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError(f"{source} has no __all__")


def _public_names(module: str) -> tuple[str, ...]:
    """The names of `module` (fastnn or a public submodule) that its users may use."""
    names = _all(module) if module == "fastnn" else (PUBLIC_MODULES[module] or _all(module))
    return names + tuple(m.rpartition(".")[2] for m in PUBLIC_MODULES) if module == "fastnn" else names


def _non_public_uses(path: str) -> Iterator[str]:
    """Every fastnn name `path` uses that is not public: imports (`from fastnn.x import y`, `import fastnn.x`) and
    attributes of fastnn or of a public module bound to a name (`fastnn.x.y`, `distributed.y`)."""
    tree = ast.parse((REPO / path).read_text())
    bound: dict[str, str] = {}  # local name -> the fastnn module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name != "fastnn" and alias.name.startswith("fastnn.") and alias.name not in PUBLIC_MODULES:
                    yield alias.name
                elif alias.asname:  # `import fastnn.datasets as ds`: ds stands for the module
                    bound[alias.asname] = alias.name
                elif alias.name.partition(".")[0] == "fastnn":  # `import fastnn` (or fastnn.x): binds fastnn
                    bound["fastnn"] = "fastnn"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").partition(".")[0] == "fastnn" and not node.level:
            if node.module != "fastnn" and node.module not in PUBLIC_MODULES:
                yield node.module
                continue
            for alias in node.names:
                if alias.name not in _public_names(node.module):
                    yield f"{node.module}.{alias.name}"
                elif f"{node.module}.{alias.name}" in PUBLIC_MODULES:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            module = bound[node.value.id]
            if node.attr not in _public_names(module):
                yield f"{module}.{node.attr}"
            elif module == "fastnn" and f"fastnn.{node.attr}" in PUBLIC_MODULES:
                parent = next((p for p in ast.walk(tree) if isinstance(p, ast.Attribute) and p.value is node), None)
                if parent is not None and parent.attr not in _public_names(f"fastnn.{node.attr}"):
                    yield f"fastnn.{node.attr}.{parent.attr}"


@pytest.mark.parametrize("path", EXAMPLES)
def test_the_examples_use_the_public_api_only(path: str) -> None:
    bad = sorted(set(_non_public_uses(path)))
    assert not bad, f"{path} uses {bad}: use fastnn.__all__ and the public modules ({', '.join(PUBLIC_MODULES)})"


def test_the_examples_check_sees_what_it_looks_for(tmp_path, monkeypatch) -> None:
    """Internal modules and names are found however they are reached; public ones pass."""
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "fastnn").mkdir()
    (tmp_path / "fastnn" / "__init__.py").write_text('__all__ = ["Trainer", "datasets", "distributed"]\n')
    (tmp_path / "fastnn" / "datasets.py").write_text('__all__ = ["load"]\n')
    (tmp_path / "fastnn" / "distributed.py").write_text('__all__ = ["init"]\n')
    (tmp_path / "fastnn" / "engine").mkdir()
    (tmp_path / "fastnn" / "engine" / "__init__.py").write_text('__all__ = ["Tuning", "steps_per_epoch"]\n')
    (tmp_path / "x.py").write_text(
        "import fastnn\n"
        "import fastnn._progress\n"
        "from fastnn import distributed, Trainer, History\n"
        "from fastnn.engine import Tuning, steps_per_epoch\n"
        "from fastnn._state import MAX_EPOCH\n"
        "fastnn.Trainer; fastnn.datasets.load; fastnn.datasets.DATASETS; fastnn._control; distributed.init\n"
        "distributed.Group\n"
    )
    assert set(_non_public_uses("x.py")) == {
        "fastnn.History", "fastnn._control", "fastnn.datasets.DATASETS", "fastnn.distributed.Group",
        "fastnn.engine.steps_per_epoch", "fastnn._progress", "fastnn._state",
    }  # fmt: skip


def test_the_top_level_modules_are_public_or_underscored() -> None:
    """A module at the top of fastnn/ is public (documented, in PUBLIC_MODULES) or has an underscore name, so that
    `dir(fastnn)` and the docs show the public API only."""
    public = {m.rpartition(".")[2] for m in PUBLIC_MODULES}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    names = {p.stem for p in PACKAGE.glob("*.py")} | packages
    assert sorted(n for n in names if not n.startswith("_") and n not in public | {"cuda"}) == []


def test_dir_fastnn_lists_the_public_api_only() -> None:
    """After `import fastnn` and a CPU fit (which imports more of fastnn), the names without an underscore are
    `fastnn.__all__` and `engine` (for `fastnn.engine.Tuning`): no internal module is left as an attribute."""
    import json
    import subprocess

    code = (
        "import numpy as np, fastnn\n"
        "t = fastnn.Trainer(fastnn.MLP([2, 2]), device='cpu', batch_size=4)\n"
        "t.fit(np.zeros((8, 2), np.float32), np.zeros(8, np.int64), progress=False)\n"
        "print(json.dumps([[n for n in dir(fastnn) if not n.startswith('_')], fastnn.__all__]))\n"
    )
    out = subprocess.run([sys.executable, "-c", "import json\n" + code], capture_output=True, text=True, cwd=REPO,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    shown, public = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(shown) == (set(public) - {"__version__"}) | {"engine"}, sorted(set(shown) ^ set(public))

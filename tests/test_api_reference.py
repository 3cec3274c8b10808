"""The rendered API reference (mkdocs + mkdocstrings, as CI builds it) lists every public method and attribute of
every public class, each with its entry, and no private or dunder name (issue 43). Skipped where the docs' tools
are not installed (docs/requirements.txt)."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Page (under docs/reference/) -> the public module whose names it documents (None: that module's __all__).
PAGES = {"fastnn": "fastnn", "sklearn": "fastnn.sklearn", "datasets": "fastnn.datasets",
         "schedules": "fastnn.schedules", "distributed": "fastnn.distributed"}  # fmt: skip
#: Names a class has for scikit-learn's parameter set but that mean nothing on it (refused or fixed).
HIDDEN = {("fastnn.sklearn", "LogisticRegression"): {"alpha", "max_fun"}}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    return out


def _ids(site: Path, page: str) -> set[str]:
    return set(re.findall(r'id="(fastnn(?:\.[^"]*)?)"', (site / "reference" / page / "index.html").read_text()))


def _public_members(cls: type) -> set[str]:
    """Names without an underscore that fastnn's own classes define on `cls` (scikit-learn's inherited
    get_params, score, ... are scikit-learn's to document)."""
    names = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("fastnn"):
            continue
        names |= {n for n in vars(klass) if not n.startswith("_")}
        names |= {n for n in getattr(klass, "__annotations__", {}) if not n.startswith("_")}
    # scikit-learn's metadata routing writes set_fit_request & co. onto each estimator class: its names, its docs
    return {n for n in names if not re.fullmatch(r"set_\w+_request", n)}


@pytest.mark.parametrize("page,module", PAGES.items())
def test_every_public_name_and_member_has_an_entry(site, page, module):
    mod = importlib.import_module(module)
    ids = _ids(site, page)
    missing = []
    for name in mod.__all__:
        obj = getattr(mod, name)
        if inspect.ismodule(obj) or name == "__version__":
            continue
        path = f"{module}.{name}"
        if path not in ids:
            missing.append(path)
        if inspect.isclass(obj) and obj.__name__ == name:  # not an alias (schedules.constant is Constant)
            hidden = HIDDEN.get((module, name), set())
            missing += [f"{path}.{m}" for m in sorted(_public_members(obj) - hidden) if f"{path}.{m}" not in ids]
    assert not missing, missing


@pytest.mark.parametrize("page", PAGES)
def test_no_private_or_dunder_entry(site, page):
    shown = [i for i in _ids(site, page) if re.search(r"\._", i)]
    assert not shown, shown
    module = importlib.import_module(PAGES[page])
    top = {i[len(PAGES[page]) + 1 :].split(".")[0] for i in _ids(site, page) if i.startswith(PAGES[page] + ".")}
    assert top <= set(module.__all__), sorted(top - set(module.__all__))  # a module page: its __all__ only
    hidden = [f"fastnn.sklearn.LogisticRegression.{n}" for n in HIDDEN[("fastnn.sklearn", "LogisticRegression")]]
    assert not set(hidden) & _ids(site, "sklearn")

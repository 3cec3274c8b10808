"""The README's quick start and the docs' tested examples run as written on a CPU-only install (cuda-bindings made
unimportable); every code block of the README and the docs parses; the README's links lead to files."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _data import fashion_dir, where

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
#: Put on its own line right above a ```python block in docs/, it makes this file run the block as written.
TESTED = "<!-- tested: tests/test_readme.py runs this block as written"

#: Run before a block: make every `cuda` module unimportable, as on `pip install -e .` without an extra.
NO_CUDA = """
import importlib.abc, sys
class _NoCuda(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "cuda" or name.startswith("cuda."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, _NoCuda())
"""


def quick_start_blocks() -> list[str]:
    text = README.read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return python_blocks(section)


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def doc_pages() -> list[Path]:
    """The docs' own markdown pages (links into benchmarks/ and the changelog are other files' copies)."""
    return sorted(p for p in DOCS.rglob("*.md") if not p.is_symlink())


def marked_blocks() -> list[tuple[str, str]]:
    """(page, code) of every docs block marked TESTED."""
    found = []
    for page in doc_pages():
        for code in re.findall(re.escape(TESTED) + r".*?-->\s*\n```python\n(.*?)^```", page.read_text(),
                               flags=re.S | re.M):  # fmt: skip
            found.append((str(page.relative_to(REPO)), code))
    return found


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_CUDA + code], capture_output=True, text=True, env=env,
                          cwd=README.parent, timeout=600)  # fmt: skip


def test_the_quick_start_has_the_two_blocks():
    blocks = quick_start_blocks()
    assert len(blocks) == 2 and "fastnn.Trainer" in blocks[0] and "fastnn.sklearn" in blocks[1]


def test_quick_start_trainer_runs_on_a_cpu_only_install():
    folder = fashion_dir()
    if folder is None:
        pytest.skip(f"Fashion-MNIST not found in {where()}: the quick start would download it")
    env = dict(os.environ, FASTNN_DATA=str(folder))  # where the block's load() looks first
    out = _run(quick_start_blocks()[0], env)
    assert out.returncode == 0, out.stderr
    accuracy = float(re.search(r"'accuracy': ([0-9.]+)", out.stdout).group(1))
    assert accuracy > 0.83, out.stdout  # the README says "about 0.85"
    assert "training on the CPU" in out.stderr and 'pip install -e ".[cu12]"' in out.stderr  # what to install


def test_quick_start_sklearn_runs_on_a_cpu_only_install():
    pytest.importorskip("sklearn")
    out = _run(quick_start_blocks()[1], dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.strip().splitlines()[-1]) > 0.95, out.stdout  # the README says "about 0.97"
    assert "ConvergenceWarning" not in out.stderr, out.stderr  # max_iter=50 is enough: it stops on tol


def test_binding_tests_skip_with_their_reason_on_a_cpu_only_install():
    """Without the CUDA wheels every test module still collects, and each `bindings` test skips saying what to
    install (the unit tests need NumPy only; `gpu` tests skip where no GPU is usable)."""
    args = ["-q", "-p", "no:cacheprovider", "-m", "bindings", "-rs", str(REPO / "tests")]
    code = NO_CUDA + f"import sys, pytest; sys.exit(pytest.main({args!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    summary = out.stdout.strip().splitlines()[-1]
    assert "skipped" in summary and "passed" not in summary and "error" not in summary, summary
    assert 'needs the CUDA wheels' in out.stdout and 'pip install -e ".[cu12]"' in out.stdout


def test_the_docs_quick_start_is_the_readmes():
    """The README's quick start is repeated in the docs' guide: one copy runs (above), both stay the same."""
    readme = quick_start_blocks()
    assert python_blocks((DOCS / "guide" / "quickstart.md").read_text()) == readme
    assert python_blocks((DOCS / "guide" / "sklearn.md").read_text()) == readme[1:]


def test_every_code_block_of_the_readme_and_docs_parses():
    pages = [README, *doc_pages()]
    blocks = [(page, code) for page in pages for code in python_blocks(page.read_text())]
    assert len(blocks) > 10
    for page, code in blocks:
        ast.parse(code, filename=str(page))  # a SyntaxError names the page and line


def test_ci_runs_the_readmes_test_command_verbatim():
    """.ci/run's last command is the README's test command, so CI checks the command a newcomer types (the two
    drifted apart once: the README dropped multi-cu12 while CI kept it)."""
    readme = re.findall(r"^pip install -e .*pytest -q$", README.read_text(), flags=re.M)
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert len(readme) == 1, readme
    assert ci[-1] == readme[0]


def test_the_readmes_links_lead_to_files():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert any(link.startswith("docs/") for link in local)
    assert [link for link in local if not (REPO / link).exists()] == []


@pytest.mark.parametrize("page,code", marked_blocks(), ids=lambda v: v if v.endswith(".md") else "")
def test_tested_docs_blocks_run_on_a_cpu_only_install(page, code, tmp_path):
    """In a folder of their own (they may write files), with this checkout's fastnn."""
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", NO_CUDA + code], capture_output=True, text=True, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=path), timeout=600)  # fmt: skip
    assert out.returncode == 0, f"{page}: {out.stderr}"


def test_some_docs_blocks_are_tested():
    assert {page for page, _ in marked_blocks()} >= {"docs/guide/training.md"}


def test_the_api_reference_covers_the_public_api():
    """Every name of fastnn.__all__ has its entry (its module's page for a module); the module pages render their
    own __all__ and no underscore name (mkdocs.yml's filters; tests/test_api_reference.py checks the built pages)."""
    import types

    import fastnn

    reference = DOCS / "reference"
    entries = set(re.findall(r"^::: (\S+)$", (reference / "fastnn.md").read_text(), flags=re.M))
    for name in fastnn.__all__:
        if isinstance(getattr(fastnn, name), types.ModuleType):
            assert f"::: fastnn.{name}" in (reference / f"{name}.md").read_text()
        elif name != "__version__":
            assert f"fastnn.{name}" in entries, name
    for module in ("sklearn", "distributed"):
        assert f"::: fastnn.{module}" in (reference / f"{module}.md").read_text()
    assert "::: fastnn.engine.Tuning" in (reference / "engine.md").read_text()  # Trainer(tuning=): advanced, public
    assert "filters: public" in (REPO / "mkdocs.yml").read_text()

"""The distribution is fastnn-cuda (`fastnn` on the package index is another project): every install hint installs
this project, and a clone run from its parent folder says what happened."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fastnn
from fastnn import _install as install
from fastnn._environment import CudaPackages
from fastnn.cuda import _loader

REPO = Path(__file__).resolve().parents[1]

#: An install command naming the other project: `fastnn[...]`, or `pip install fastnn` not followed by -cuda.
FOREIGN = re.compile(r"(?<![-\w])fastnn\[|pip install [\"']?fastnn(?![-\w])")


def test_pyproject_names_the_distribution_the_hints_use():
    text = (REPO / "pyproject.toml").read_text()
    project = text.split("[project]\n", 1)[1].split("\n[", 1)[0]  # tomllib is Python 3.11+, fastnn runs on 3.10
    assert re.search(r'^name = "fastnn-cuda"$', project, re.M) and install.DISTRIBUTION == "fastnn-cuda"
    assert re.search(rf'^version = "{re.escape(fastnn.__version__)}"$', project, re.M)


def _sources() -> list[Path]:
    """Every file of the project that can print or show an install command, but README.md (the docs' own)."""
    files = [REPO / "pyproject.toml", REPO / ".ci" / "run", REPO / "__main__.py"]
    for folder in ("fastnn", "examples", "benchmarks", "tests", "native"):
        files += [p for p in (REPO / folder).rglob("*") if p.suffix in (".py", ".md", ".cu", ".cuh", ".toml")]
    return [p for p in files if p.is_file()]


def test_no_hint_anywhere_installs_the_other_project():
    this = Path(__file__).resolve()
    found = [
        f"{p.relative_to(REPO)}:{i}: {line.strip()}"
        for p in _sources()
        if p.resolve() != this
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if FOREIGN.search(line)
    ]
    assert not found, "\n".join(found)
    assert FOREIGN.search('pip install "fastnn[cu12]"') and FOREIGN.search("pip install fastnn")
    assert not FOREIGN.search('pip install "fastnn-cuda[cu12]"') and not FOREIGN.search('pip install -e ".[cu12]"')


@pytest.mark.parametrize(
    "hint",
    [
        _loader.INSTALL_HINT,
        _loader.NCCL_HINT,
        CudaPackages(None, ()).summary(),
        CudaPackages("13.0.2", (("nvidia-cublas-cu12", "12.9.1.4", 12),)).problem(),
    ],
    ids=["cuda-libraries", "nccl", "no-cuda-packages", "mixed-cuda"],
)
def test_each_hint_gives_the_checkout_command_while_unpublished(hint):
    assert re.search(r'pip install -e "\.\[(multi-)?cu1[23]\]"', hint), hint
    assert "fastnn-cuda" not in hint, hint  # the name is not on the package index: no hint may send anyone there


def test_pip_install(monkeypatch):
    assert install.PUBLISHED is False  # a release flips it, and this test with it
    assert install.pip_install("cu12") == 'pip install -e ".[cu12]" (in a fastnn checkout)'
    assert install.pip_install() == 'pip install -e . (in a fastnn checkout)'
    monkeypatch.setattr(install, "PUBLISHED", True)
    assert install.pip_install("cu12") == 'pip install "fastnn-cuda[cu12]" (from a checkout: pip install -e ".[cu12]")'


def test_no_doc_or_hint_sends_anyone_to_the_unpublished_name():
    """Until PUBLISHED, `pip install fastnn-cuda` finds nothing (or someone else's upload): no page or message
    gives it as a command."""
    pages = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *_sources()]
    this = Path(__file__).resolve()
    found = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in pages if p.is_file() and p.resolve() != this
             for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             if re.search(r"pip install [\"']?fastnn-cuda", line)]  # fmt: skip
    assert install.PUBLISHED or not found, "\n".join(found)


def test_a_clone_run_from_its_parent_folder_says_what_happened(tmp_path: Path):
    """`python -m fastnn` in the folder holding a clone named fastnn imports the clone's top folder as a namespace
    package: the clone's __main__.py explains, instead of "'fastnn' is a package and cannot be directly executed"."""
    if "site-packages" in Path(fastnn.__file__).parts:  # CI's run of the installed wheel (.ci/run)
        pytest.skip("fastnn is installed (not editable): its package wins over a clone's folder, so the case "
                    "this test is about cannot arise")  # fmt: skip
    clone = tmp_path / "fastnn"
    clone.mkdir()
    shutil.copy(REPO / "__main__.py", clone / "__main__.py")
    os.symlink(REPO / "fastnn", clone / "fastnn")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # fastnn importable only as the clone
    out = subprocess.run([sys.executable, "-m", "fastnn", "info"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "as an empty namespace package" in out.stderr and f"({tmp_path})" in out.stderr
    assert f"cd {clone}" in out.stderr and f"pip install -e {clone}" in out.stderr
    assert "Traceback" not in out.stderr
    # `python <checkout> info` runs the real command line.
    out = subprocess.run([sys.executable, str(clone), "--version"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == f"fastnn {fastnn.__version__}", out.stderr

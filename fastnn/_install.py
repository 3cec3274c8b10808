"""How this project is installed: its name on the package index, and the one form of every "pip install" hint.

The import name is `fastnn`, but the distribution is `fastnn-cuda`: `fastnn` on the package index is another
project (it pulls in accelerate and auto-gptq), which a hint naming the bare `fastnn` would install.
Every hint fastnn prints comes from `pip_install`. The name is not on the package index yet (PUBLISHED, the one
place that says so): until it is, every hint, doc and warning says to install from a checkout. This module imports
nothing of fastnn's, so the bindings can use it too.
"""

from __future__ import annotations

import importlib.metadata

__all__ = ["DISTRIBUTION", "PUBLISHED", "OTHER_PROJECT", "installed_version", "other_project_version", "pip_install"]

#: The distribution name (pyproject.toml's [project] name), under which this project will be published.
DISTRIBUTION = "fastnn-cuda"
#: The unrelated project that owns the name `fastnn` on the package index.
OTHER_PROJECT = "fastnn"
#: Whether DISTRIBUTION is on the package index. It is not (the project is unreleased): installing that name finds
#: nothing, or someone else's upload, so until a release sets this, hints give the checkout's command only.
PUBLISHED = False


def pip_install(extra: str | None = None) -> str:
    """The command that installs this project with `extra`: from a checkout while unpublished,
    'pip install -e ".[cu12]" (in a fastnn checkout)'; once PUBLISHED, the package index's command first."""
    tag = f"[{extra}]" if extra else ""
    checkout = f'pip install -e ".{tag}"' if tag else "pip install -e ."
    if not PUBLISHED:
        return f"{checkout} (in a fastnn checkout)"
    return f'pip install "{DISTRIBUTION}{tag}" (from a checkout: {checkout})'


def installed_version() -> str | None:
    """The installed version of this project's distribution, or None (run from a checkout, not installed)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def other_project_version() -> str | None:
    """The version of the other project named `fastnn` when it is installed (it may own the `fastnn` folder
    in site-packages, shadowing this one), else None."""
    try:
        dist = importlib.metadata.distribution(OTHER_PROJECT)
    except importlib.metadata.PackageNotFoundError:
        return None
    return dist.version if (dist.metadata["Name"] or "").lower() == OTHER_PROJECT else None

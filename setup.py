"""fastnn's package list, found rather than written out (pyproject.toml holds the rest of the build's settings).

Every folder under fastnn/ with an __init__.py is a package, so a new engine cannot be left out of the wheel by a
hand-kept list (a wheel without fastnn.engine.grid shipped that way); fastnn.native is the kernel sources, kept at the
repository's root as native/ and mapped into the package by pyproject.toml's package-dir. tests/test_wheel.py
compares a built wheel's files with the source tree.
"""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["fastnn", "fastnn.*"]), "fastnn.native"])

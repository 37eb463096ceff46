"""The wheel holds every package of the source tree: setuptools installs only the packages
pyproject.toml lists, and an editable install hides a missing one."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")

REPO = Path(__file__).resolve().parents[2]


def _packages_in_tree() -> set[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for name, where in config["package-dir"].items():
        root = REPO / where
        for init in root.rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                rel = init.parent.relative_to(root).parts
                found.add(".".join((name, *rel)))
    return found


def test_every_package_in_the_tree_is_listed_for_the_wheel():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    in_tree = _packages_in_tree()
    assert in_tree - listed == set(), "packages missing from pyproject.toml: the wheel would lack them"
    assert listed - in_tree == set(), "pyproject.toml lists packages the tree does not have"


def test_the_packages_hold_no_data_files_the_wheel_would_drop():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    stray = [str(f.relative_to(REPO)) for where in config["package-dir"].values()
             for f in (REPO / where).rglob("*")
             if f.is_file() and f.suffix not in {".py", ".pyc"} and "__pycache__" not in f.parts]
    assert stray == [] or "package-data" in config, stray

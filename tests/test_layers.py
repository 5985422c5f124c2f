"""The import structure a newcomer relies on: no module imports itself back through others,
and the analytic core's layers (the import-linter contracts in pyproject.toml) hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

ROOT = Path(__file__).resolve().parents[1]
# grimp comes with import-linter (the test extra); a GPU image that runs `pytest -m gpu` may lack it.
grimp = pytest.importorskip("grimp")

PACKAGES = ("perfmodel", "profilers", "decoder", "reports")


def import_cycles(graph) -> list[list[str]]:
    """Groups of modules that import each other, directly or through others: the strongly
    connected components of the import graph with more than one module."""
    modules = sorted(graph.modules)
    index = {name: i for i, name in enumerate(modules)}
    rows, cols = [], []
    for name in modules:
        for target in graph.find_modules_directly_imported_by(name):
            if target in index:
                rows.append(index[name])
                cols.append(index[target])
    matrix = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(modules), len(modules)))
    _, labels = connected_components(matrix, directed=True, connection="strong")
    groups: dict[int, list[str]] = {}
    for name, label in zip(modules, labels):
        groups.setdefault(label, []).append(name)
    return [sorted(group) for group in groups.values() if len(group) > 1]


def test_no_import_cycle_anywhere():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert import_cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    # The check above must be able to fail: two modules importing each other are one group.
    graph = grimp.ImportGraph()
    for name in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(name)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.a")
    graph.add_import(importer="pkg.c", imported="pkg.a")
    assert import_cycles(graph) == [["pkg.a", "pkg.b"]]


def test_import_layers_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "broken" in result.stdout and ", 0 broken" in result.stdout

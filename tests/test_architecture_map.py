"""docs/architecture.md's module map can be trusted: it names every module of perfmodel/,
profilers/, decoder/ and reports/, each in a row of its own, and every module path the page
names is in the tree, so the map goes stale neither way.

A module is a `.py` file under those packages, `__init__.py` files and the data folders
(`measurements/`, `assets/`) aside. The map names one by its path, in backticks, in the first
cell of a table row: | `perfmodel/latency/source.py` | its one job |.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
PACKAGES = ("perfmodel", "profilers", "decoder", "reports")
DATA_FOLDERS = {"measurements", "assets", "tests", "__pycache__"}
PATH = r"(?:%s)/[\w/]*\.py" % "|".join(PACKAGES)
# A row of the map: its first cell is one module path in backticks.
ROW = re.compile(rf"^\|\s*`({PATH})`\s*\|", re.MULTILINE)
# Any module path the page names, in a table or in prose.
NAMED = re.compile(rf"`({PATH})`")


def modules_in_the_tree() -> set[str]:
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            relative = path.relative_to(ROOT)
            if path.name != "__init__.py" and not DATA_FOLDERS & set(relative.parts[:-1]):
                found.add(relative.as_posix())
    return found


def test_the_map_names_every_module_and_only_modules_that_exist():
    text = PAGE.read_text(encoding="utf-8")
    modules = modules_in_the_tree()
    mapped = set(ROW.findall(text))
    named = set(NAMED.findall(text))
    missing = sorted(modules - mapped)
    unknown = sorted(path for path in named if not (ROOT / path).is_file())
    assert not missing and not unknown, (
        f"docs/architecture.md's module map is stale.\n"
        f"Modules with no row in the map ({len(missing)}): {', '.join(missing) or 'none'}\n"
        f"Paths the page names that are not in the tree ({len(unknown)}): {', '.join(unknown) or 'none'}"
    )


def test_the_map_names_each_module_once():
    rows = ROW.findall(PAGE.read_text(encoding="utf-8"))
    twice = sorted({path for path in rows if rows.count(path) > 1})
    assert not twice, f"modules with more than one row in docs/architecture.md's map: {', '.join(twice)}"

"""What a closed-loop run decodes with: no tree (plain decoding), a static tree of the heads'
accuracies, or a dynamic tree built per step. A str: it keys the runs, prints and writes as
its name (the tables' tree_kind column); code compares members."""

from __future__ import annotations

from enum import StrEnum


class TreeKind(StrEnum):
    PLAIN = "plain"
    STATIC = "static"
    DYNAMIC = "dynamic"

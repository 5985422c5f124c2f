"""Where a number comes from, as every data row's `source` column says it (docs/data-contract.md):
measured on a device, or predicted by the model. A str: rows write its name; code compares
members."""

from __future__ import annotations

from enum import StrEnum


class Provenance(StrEnum):
    MEASURED = "measured"
    PREDICTED = "predicted"

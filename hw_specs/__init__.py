"""Device spec files (YAML), shipped as package data; see README.md here."""

from pathlib import Path

SPEC_DIR = Path(__file__).parent

"""Reading a JSON file the user pointed at, with errors that name the file and the problem."""

from __future__ import annotations

import json
from pathlib import Path

from perfmodel.base.errors import PerfkitError


def read_json(path: str | Path, what: str):
    """The parsed contents of `path`; `what` names the file in errors ("model config")."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise PerfkitError(f"{path}: {what} is not UTF-8 text (byte {exc.start}); JSON files must be UTF-8") from None
    except OSError as exc:
        raise PerfkitError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise PerfkitError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None

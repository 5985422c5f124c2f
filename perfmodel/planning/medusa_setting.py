"""The one meaning of a Medusa setting (`--medusa auto|on|off`, `medusa=` in Python), read by
the capacity plan, the speculation schedule and the serving simulation alike."""

from __future__ import annotations

from perfmodel.base.errors import PerfkitError

MEDUSA_MODES = {
    "auto": "the best tree per band, or off where none beats plain decoding",
    "on": "the best tree everywhere, even where it loses",
    "off": "plain decoding everywhere",
}


def check_setting(value: str, allowed: dict[str, str], what: str) -> str:
    """`value` if it is one of `allowed` (name -> meaning), else one line naming both."""
    if value not in allowed:
        meanings = ", ".join(f"{name} = {meaning}" for name, meaning in allowed.items())
        raise PerfkitError(f"unknown {what} {value!r}; choose from: {', '.join(allowed)} ({meanings})")
    return value


def check_medusa(medusa: str) -> str:
    return check_setting(medusa, MEDUSA_MODES, "medusa setting")

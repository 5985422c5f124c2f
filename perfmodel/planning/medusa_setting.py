"""The one meaning of a Medusa setting (`--medusa auto|on|off`, `medusa=` in Python), read by
the capacity plan, the speculation schedule and the serving simulation alike."""

from __future__ import annotations

from enum import StrEnum

from perfmodel.base.errors import PerfkitError


class MedusaSetting(StrEnum):
    """Where a deployment runs Medusa trees. A str, so it prints, compares and writes to JSON
    as its name; code compares it with its members, never with text."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


MEDUSA_MODES = {
    MedusaSetting.AUTO: "the best tree per band, or off where none beats plain decoding",
    MedusaSetting.ON: "the best tree everywhere, even where it loses",
    MedusaSetting.OFF: "plain decoding everywhere",
}


def check_setting(value: str, allowed: dict[str, str], what: str) -> str:
    """`value` if it is one of `allowed` (name -> meaning), else one line naming both."""
    if value not in allowed:
        meanings = ", ".join(f"{name} = {meaning}" for name, meaning in allowed.items())
        raise PerfkitError(f"unknown {what} {value!r}; choose from: {', '.join(allowed)} ({meanings})")
    return value


def check_medusa(medusa: str) -> MedusaSetting:
    """The setting `medusa` names, or one line naming what is allowed."""
    return MedusaSetting(check_setting(medusa, MEDUSA_MODES, "medusa setting"))

"""What a latency may rest on, and what was asked for: the choice a command's --latency and
--stack make (LatencySetting, LatencyChoice) and what a latency source resolved it to
(LatencyMode). perfmodel.latency.source resolves them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

from perfmodel.base.errors import PerfkitError


class LatencySetting(StrEnum):
    """The latency source asked for: auto (measured where the device was measured, else
    calibrated, borrowed or the datasheet), or one forced."""

    AUTO = "auto"
    MEASURED = "measured"
    CALIBRATED = "calibrated"
    DATASHEET = "datasheet"


LATENCY_CHOICES = tuple(setting.value for setting in LatencySetting)


@dataclass(frozen=True)
class LatencyChoice:
    """The latency source asked for (`setting`) and the stack whose measurements it rests on
    (`stack`, None for the device's default): what a command's --latency and --stack make
    together, handed down as one choice. Printed, it is the setting's name."""

    setting: LatencySetting = LatencySetting.AUTO
    stack: str | None = None

    @classmethod
    def of(cls, choice: str | LatencyChoice = LatencySetting.AUTO, stack: str | None = None) -> LatencyChoice:
        """A choice from a setting's name or a choice, with `stack` in place of its own where
        given; an unknown setting is refused in one line naming those there are."""
        if isinstance(choice, LatencyChoice):
            return choice if stack is None else dataclasses.replace(choice, stack=stack)
        if choice not in LATENCY_CHOICES:
            raise PerfkitError(f"unknown latency source {choice!r}; choose from: {', '.join(LATENCY_CHOICES)}")
        return cls(LatencySetting(choice), stack)

    def __str__(self) -> str:
        return self.setting.value


class LatencyMode(StrEnum):
    """What a latency source's GEMM times rest on (perfmodel.latency.source explains each): a str, so tables
    and labels read its name; code compares it with its members."""

    MEASURED = "measured"
    CALIBRATED = "calibrated"
    GRID = "grid"
    BORROWED = "borrowed"
    TRANSFERRED = "transferred"
    DATASHEET = "datasheet"

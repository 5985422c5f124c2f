"""What a latency may rest on, and what was asked for: the choice a command's --latency and
--stack make (LatencySetting, LatencyChoice) and what a latency source resolved it to
(LatencyMode). perfmodel.latency.source resolves them."""

from __future__ import annotations

from enum import StrEnum


class LatencySetting(StrEnum):
    """The latency source asked for: auto (measured where the device was measured, else
    calibrated, borrowed or the datasheet), or one forced."""

    AUTO = "auto"
    MEASURED = "measured"
    CALIBRATED = "calibrated"
    DATASHEET = "datasheet"


LATENCY_CHOICES = tuple(setting.value for setting in LatencySetting)


class LatencyChoice(str):
    """A latency choice (LATENCY_CHOICES) with the stack whose measurements it rests on
    (`stack`, None for the device's default). It is the choice's text wherever a choice is
    compared, printed or handed down, so the planners, tables and reports that pass a choice
    on to view_latency carry the stack without a second argument at every level."""

    stack: str | None

    def __new__(cls, source: str = "auto", stack: str | None = None) -> LatencyChoice:
        choice = super().__new__(cls, source)
        choice.stack = stack
        return choice

    def __reduce__(self):  # worker processes get the stack too
        return (LatencyChoice, (str(self), self.stack))


class LatencyMode(StrEnum):
    """What a latency source's GEMM times rest on (perfmodel.latency.source explains each): a str, so tables
    and labels read its name; code compares it with its members."""

    MEASURED = "measured"
    CALIBRATED = "calibrated"
    GRID = "grid"
    BORROWED = "borrowed"
    TRANSFERRED = "transferred"
    DATASHEET = "datasheet"

"""Checks shared by the figure and report tests: a PNG shows a plot, and an HTML page read
back as its structure (sections, tables, figures with their badges) rather than as text."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import pytest
import yaml

from hw_specs import SPEC_DIR
from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from profilers import sweep_runs
from profilers.timer import TimerConfig
from reports.readme_samples import exit_status


def assert_png_shows_a_plot(path: Path) -> None:
    """A readable figure: big enough, and neither blank nor a solid block."""
    pixels = matplotlib.image.imread(path)[..., :3]
    assert pixels.shape[0] > 300 and pixels.shape[1] > 600, f"{path.name}: {pixels.shape[1]}x{pixels.shape[0]}"
    dark = (pixels.mean(axis=2) < 0.6).mean()
    assert 0.005 < dark < 0.5, f"{path.name}: {dark:.3%} dark pixels"


@dataclass
class Table:
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    summary: str | None = None  # the toggle it is folded under, if any

    def column(self, name: str) -> list[str]:
        assert name in self.columns, f"no column {name!r} in {self.columns}"
        return [row[self.columns.index(name)] for row in self.rows]

    def numbers(self, name: str) -> list[float]:
        return [number(cell) for cell in self.column(name)]

    def records(self) -> list[dict[str, str]]:
        return [dict(zip(self.columns, row)) for row in self.rows]


@dataclass
class Figure:
    alt: str
    badges: list[str] = field(default_factory=list)  # "predicted" / "measured", in order


@dataclass
class Section:
    heading: str  # "" for what comes before the first heading
    paragraphs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # paragraphs set apart as notes
    bullets: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    preformatted: list[tuple[str | None, str]] = field(default_factory=list)  # (toggle summary, text)

    def table(self, *columns: str) -> Table:
        """The one table of this section that has these columns."""
        found = [t for t in self.tables if set(columns) <= set(t.columns)]
        assert len(found) == 1, f"{len(found)} tables with {columns} in {self.heading!r}"
        return found[0]


class _PageParser(HTMLParser):
    TEXT = {"h2", "p", "li", "th", "td", "summary", "pre", "a"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.sections = [Section("")]
        self.contents: list[str] = []  # the navigation's entries
        self.text: list[str] | None = None
        self.note = self.in_nav = self.in_details = False
        self.summary: str | None = None
        self.row: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        section = self.sections[-1]
        if tag in self.TEXT:
            self.text = []
            self.note = tag == "p" and attrs.get("class") == "note"
        if tag == "nav":
            self.in_nav = True
        elif tag == "details":
            self.in_details, self.summary = True, None
        elif tag == "table":
            section.tables.append(Table([], summary=self.summary if self.in_details else None))
        elif tag == "tr":
            self.row = []
        elif tag == "img":
            section.figures.append(Figure(attrs.get("alt", "")))
        elif tag == "span" and "tag" in (attrs.get("class") or "").split():
            section.figures[-1].badges.append(attrs["class"].split()[-1])

    def handle_data(self, data):
        if self.text is not None:
            self.text.append(data)

    def handle_endtag(self, tag):
        section = self.sections[-1]
        if tag == "nav":
            self.in_nav = False
        elif tag == "details":
            self.in_details = False
        elif tag == "tr" and self.row is not None:
            if self.row:  # not the header's row
                section.tables[-1].rows.append(self.row)
            self.row = None
        if tag not in self.TEXT or self.text is None:
            return
        text, self.text = "".join(self.text), None
        if tag == "a" and self.in_nav:
            self.contents.append(text)
        elif tag == "h2":
            self.sections.append(Section(text))
        elif tag == "p":
            (section.notes if self.note else section.paragraphs).append(text)
        elif tag == "li" and not self.in_nav:
            section.bullets.append(text)
        elif tag == "th":
            section.tables[-1].columns.append(text)
        elif tag == "td":
            self.row.append(text)
        elif tag == "summary":
            self.summary = text
        elif tag == "pre":
            section.preformatted.append((self.summary if self.in_details else None, text))


@dataclass
class ParsedPage:
    sections: list[Section]
    contents: list[str]  # the table of contents' entries

    @property
    def headings(self) -> list[str]:
        return [s.heading for s in self.sections[1:]]

    def section(self, prefix: str) -> Section:
        """The one section whose heading starts with `prefix`."""
        found = [s for s in self.sections[1:] if s.heading.startswith(prefix)]
        assert len(found) == 1, f"{len(found)} sections {prefix!r} in {self.headings}"
        return found[0]

    def figures(self) -> list[Figure]:
        return [f for s in self.sections for f in s.figures]

    def tables(self) -> list[Table]:
        return [t for s in self.sections for t in s.tables]


def parse_page(html: str) -> ParsedPage:
    parser = _PageParser()
    parser.feed(html)
    parser.close()
    return ParsedPage(parser.sections, parser.contents)


def assert_in_order(items: list[str], prefixes: list[str]) -> None:
    """Each prefix starts one of `items`, in this order (others may come between)."""
    at = 0
    for prefix in prefixes:
        found = next((i for i in range(at, len(items)) if items[i].startswith(prefix)), None)
        assert found is not None, f"no {prefix!r} after {items[:at]} in {items}"
        at = found + 1


NUMBER = re.compile(r"[+-]?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?%?")


def number(text: str) -> float:
    """A cell or a number in a sentence as a value: '1,935' 1935, '+12.7%' 0.127, '2.01x' 2.01."""
    match = NUMBER.search(text)
    assert match, f"no number in {text!r}"
    word = match.group(0)
    value = float(word.rstrip("%").replace(",", ""))
    return value / 100 if word.endswith("%") else value


def numbers(text: str) -> list[float]:
    """Every number in a text, in order."""
    return [number(word) for word in NUMBER.findall(text)]


def custom_spec(tmp_path: Path, **changes) -> Path:
    """A spec file of one's own, the A40's with `changes` (None removes a field), named
    "My Accelerator" in my_gpu.yaml (key my-gpu)."""
    data = yaml.safe_load((SPEC_DIR / "a40.yaml").read_text())
    data["name"] = "My Accelerator"
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path = tmp_path / "my_gpu.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def one_line_error(call, *fragments) -> str:
    """The PerfkitError `call()` raises: one line, holding every fragment."""
    with pytest.raises(PerfkitError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


@dataclass(frozen=True)
class Ran:
    status: int
    out: str
    err: str


def run_here(main, argv: list[str], capsys) -> Ran:
    """A command's main run as `python -m` runs it (perfmodel.cli.run: a PerfkitError is one
    `error:` line and status 1; argparse's usage errors exit 2), in this process: a command
    line in a subprocess first imports torch, pandas and matplotlib again (2-3 s on two busy
    cores). The module's own `python -m` has a test of its own where it matters."""
    capsys.readouterr()
    try:
        status = run(main, argv)
    except SystemExit as exc:
        status = exit_status(exc)
    captured = capsys.readouterr()
    return Ran(status, captured.out, captured.err)


# What a measuring test times with: the flow it checks (sweep, store, read back, draw) needs
# real timings, not settled ones. Three samples each (the noise needs an IQR), no budget past
# them, and no cache flush between them: the flush writes twice the last-level cache, most of
# a tiny shape's sample, and the flush itself has tests of its own (test_timer, test_sweep).
QUICK_TIMER = TimerConfig(warmup=1, min_reps=3, max_reps=3, budget_s=0.0, flush_cache=False)
QUICK_CEILING_TIMER = TimerConfig(warmup=1, min_reps=3, max_reps=5, budget_s=0.05)


def time_quickly(patch: pytest.MonkeyPatch) -> None:
    """A --measure in `patch`'s context sweeps and measures its ceilings with the quick timers."""
    patch.setattr(sweep_runs, "default_timer", lambda device: QUICK_TIMER)
    patch.setattr(sweep_runs, "ceiling_timer", lambda device: QUICK_CEILING_TIMER)

"""A self-contained HTML page: figures embedded as data URIs, every string escaped.

Nothing on the page is fetched from anywhere: no scripts, fonts or stylesheets from the
network, so the file can be mailed and opened offline.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1250px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; font-size: 13px; margin: .5em 0 1em; }
th, td { border: 1px solid #ddd; padding: 2px 8px; text-align: right; }
th { background: #f3f3f3; } td.text, th.text { text-align: left; }
figure { margin: 1em 0 2em; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 13px; }
.tag { display: inline-block; padding: 0 6px; border-radius: 3px; font-size: 12px; color: #fff; }
.predicted { background: #6c7a89; } .measured { background: #1e7d32; }
details { margin: .3em 0 1em; } summary { cursor: pointer; color: #0b5394; }
nav { background: #f7f7f7; border: 1px solid #e3e3e3; padding: .4em 1em; font-size: 14px; }
nav ol { margin: .3em 0; } pre { background: #f7f7f7; padding: .5em; white-space: pre-wrap; font-size: 12px; }
.note { color: #555; font-size: 14px; }
td.cell { text-align: center; white-space: nowrap; } td.cell sup { font-weight: bold; margin-left: 3px; }
td.here { outline: 2px solid #0b5394; outline-offset: -2px; font-weight: bold; }
.legend span.key { display: inline-block; padding: 0 5px; margin: 0 3px 0 10px; border: 1px solid #ccc; }
"""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def data_uri(data: bytes, kind: str) -> str:
    return f"data:{kind};base64," + base64.b64encode(data).decode("ascii")


@dataclass(frozen=True)
class Cell:
    """A table cell with its own look: a CSS class, a short key set apart after the text (a
    legend says what it means) and a longer note shown on hover."""

    text: str
    css: str = ""
    key: str = ""
    note: str = ""

    def html(self) -> str:
        title = f' title="{esc(self.note)}"' if self.note else ""
        key = f" <sup>{esc(self.key)}</sup>" if self.key else ""
        return f'<td class="cell {esc(self.css)}"{title}>{esc(self.text)}{key}</td>'


class Page:
    """Accumulates escaped HTML fragments in order; `render` returns the whole document."""

    def __init__(self, title: str, contents: bool = False):
        self.title = title
        self.parts: list[str] = []
        self.sections: list[tuple[str, str]] = []  # (anchor, text) of each level-2 heading
        self.contents = contents
        self.contents_at = (0, 0)  # (part, section) the table of contents stands before
        self.styles: list[str] = []  # CSS a page's own tables add to STYLE

    def contents_here(self) -> Page:
        """The table of contents goes here, listing the sections that follow: what was written
        before it (the answer a page opens with) is read first and needs no entry."""
        self.contents_at = (len(self.parts), len(self.sections))
        return self

    def style(self, css: str) -> Page:
        if css not in self.styles:
            self.styles.append(css)
        return self

    def heading(self, text: str, level: int = 2) -> Page:
        anchor = f"s{len(self.sections) + 1}"
        if level == 2:
            self.sections.append((anchor, text))
        id_attr = f' id="{anchor}"' if level == 2 else ""
        self.parts.append(f"<h{level}{id_attr}>{esc(text)}</h{level}>")
        return self

    def paragraph(self, text: str, note: bool = False) -> Page:
        self.parts.append(f'<p class="note">{esc(text)}</p>' if note else f"<p>{esc(text)}</p>")
        return self

    def bullets(self, items: list[str]) -> Page:
        self.parts.append("<ul>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>")
        return self

    def preformatted(self, text: str, summary: str | None = None) -> Page:
        block = f"<pre>{esc(text)}</pre>"
        self.parts.append(f"<details><summary>{esc(summary)}</summary>{block}</details>" if summary else block)
        return self

    def tag(self, source: str) -> str:
        """A coloured 'predicted'/'measured' badge."""
        return f'<span class="tag {esc(source)}">{esc(source)}</span>'

    def figure(self, png: bytes, caption: str, sources: tuple[str, ...] = (), svg: bytes | None = None) -> Page:
        """A figure, embedded as its SVG where given (reports.render.Drawn), else its PNG."""
        badges = " ".join(self.tag(s) for s in sources)
        src = data_uri(svg, "image/svg+xml") if svg is not None else data_uri(png, "image/png")
        self.parts.append(
            f'<figure><img src="{src}" alt="{esc(caption)}">'
            f"<figcaption>{badges} {esc(after_badges(caption, sources))}</figcaption></figure>"
        )
        return self

    def table(self, df: pd.DataFrame, summary: str | None = None, float_digits: int = 4) -> Page:
        """A table; with `summary` it is folded under a <details> toggle."""
        classes = [_cls(df[c]) for c in df.columns]
        head = "".join(f'<th class="{k}">{esc(c)}</th>' for k, c in zip(classes, df.columns))
        body = []
        for row in df.itertuples(index=False):
            cells = "".join(f'<td class="{k}">{esc(_fmt(v, float_digits))}</td>' for k, v in zip(classes, row))
            body.append(f"<tr>{cells}</tr>")
        table = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
        self.parts.append(f"<details><summary>{esc(summary)}</summary>{table}</details>" if summary else table)
        return self

    def cell_table(self, columns: list[str], rows: list[list[str | Cell]]) -> Page:
        """A table of styled cells; a plain string is a row's label."""
        head = "".join(f'<th class="{"text" if i == 0 else "num"}">{esc(c)}</th>' for i, c in enumerate(columns))
        body = "".join(
            "<tr>"
            + "".join(c.html() if isinstance(c, Cell) else f'<td class="text">{esc(c)}</td>' for c in row)
            + "</tr>"
            for row in rows
        )
        self.parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        return self

    def legend(self, entries: list[tuple[Cell, str]]) -> Page:
        """What each cell style means: a sample cell's key in its colours, then the words."""
        items = "; ".join(f'<span class="key {esc(c.css)}">{esc(c.key)}</span> {esc(words)}' for c, words in entries)
        self.parts.append(f'<p class="legend note">Key: {items}.</p>')
        return self

    def render(self) -> str:
        part, section = self.contents_at
        nav = ""
        if self.contents and self.sections[section:]:
            items = "".join(f'<li><a href="#{a}">{esc(t)}</a></li>' for a, t in self.sections[section:])
            nav = f"<nav><strong>Contents</strong><ol>{items}</ol></nav>"
        body = "".join(self.parts[:part]) + nav + "".join(self.parts[part:])
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{esc(self.title)}</title><style>{STYLE}{''.join(self.styles)}</style></head><body>"
            f"<h1>{esc(self.title)}</h1>{body}</body></html>\n"
        )

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.render(), encoding="utf-8")
        return path


def _cls(column: pd.Series) -> str:
    return "num" if pd.api.types.is_numeric_dtype(column) else "text"


def _fmt(value: object, digits: int) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if value != value:  # nan
            return ""
        return f"{value:.{digits}g}"
    return str(value)


def after_badges(caption: str, sources: tuple[str, ...]) -> str:
    """The caption without a leading "predicted: " / "measured and predicted: ", which the
    badges in front of it already say."""
    head, sep, rest = caption.partition(": ")
    words = set(head.replace(",", " ").split()) - {"and"}
    return rest if sep and sources and words and words <= set(sources) else caption

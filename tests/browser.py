"""Headless Chromium for the report tests: a screenshot of a page, and the state of its
images and the order and look of what it opens with after the page has loaded (the DOM as
the browser built it, styles computed)."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

# No background traffic: this machine's network is closed, and a report must not need it.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]

# Reports carry no script; the test's copy gets this one, which records every image's state,
# the page's top-level elements in order, and the cells of the first table and of every table of
# styled cells (reports.html.Cell) with their computed look.
PAGE_CHECK = """<script>
window.addEventListener('load', () => {
  const images = [...document.images].map(i => ({alt: i.alt, complete: i.complete, natural: i.naturalWidth,
    shown: Math.round(i.getBoundingClientRect().width), src: i.getAttribute('src').slice(0, 22)}));
  const outline = [...document.body.children].filter(e => e.tagName !== 'SCRIPT')
    .map(e => ({tag: e.tagName.toLowerCase(), text: e.textContent.slice(0, 80), top: Math.round(e.offsetTop)}));
  const look = table => [...table.rows].map(r => [...r.cells].map(c => ({text: c.textContent, cls: c.className,
    background: getComputedStyle(c).backgroundColor, outline: getComputedStyle(c).outlineStyle,
    weight: getComputedStyle(c).fontWeight})));
  const table = document.querySelector('table');
  const cells = table ? look(table) : [];
  const styled = [...document.querySelectorAll('table')].filter(t => t.querySelector('td.cell')).map(look);
  document.body.setAttribute('data-page', JSON.stringify({images, outline, cells, styled}));
});
</script>"""


def chromium() -> str:
    """The browser, or a skip outside CI (CI installs it and must run the test)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed: .ci/run installs Debian's chromium package")
    pytest.skip("chromium is not installed (apt-get install chromium)")


def _run(args: list[str], profile: Path) -> str:
    done = subprocess.run(
        [chromium(), *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise AssertionError(f"chromium failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def screenshot(page: Path, out: Path, width: int = 1300, height: int = 2400) -> Path:
    _run(
        [f"--screenshot={out}", f"--window-size={width},{height}", page.resolve().as_uri()],
        page.parent / ".chromium-profile",
    )
    assert out.exists(), f"chromium wrote no screenshot of {page}"
    return out


def loaded_page(page: Path) -> dict:
    """The page after load: `images`, every <img> (complete, natural width, width shown);
    `outline`, the body's elements in order (tag, text, offset from the top); `cells`, the
    first table's rows of cells (text, class, computed background, outline style and font
    weight); `styled`, the same of every table of styled cells, in page order."""
    probe = page.with_name(page.stem + ".probe.html")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PAGE_CHECK + "</body>"), encoding="utf-8")
    dom = _run(
        ["--dump-dom", "--virtual-time-budget=15000", "--window-size=1300,1000", probe.resolve().as_uri()],
        page.parent / ".chromium-profile",
    )
    probe.unlink()
    found = re.search(r'data-page="([^"]*)"', dom)
    assert found, "the page never finished loading in chromium"
    return json.loads(html.unescape(found.group(1)))

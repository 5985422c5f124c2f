"""Headless Chromium for the report tests: a screenshot of a page, and the state of its
images after the page has loaded (the DOM as the browser built it)."""

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

# Reports carry no script; the test's copy gets this one, which records every image's state.
IMAGE_CHECK = """<script>
window.addEventListener('load', () => {
  const images = [...document.images].map(i => ({alt: i.alt, complete: i.complete, natural: i.naturalWidth,
    shown: Math.round(i.getBoundingClientRect().width), src: i.getAttribute('src').slice(0, 22)}));
  document.body.setAttribute('data-images', JSON.stringify(images));
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


def loaded_images(page: Path) -> list[dict]:
    """Every <img> of the page after load: complete, natural width, width shown."""
    probe = page.with_name(page.stem + ".probe.html")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", IMAGE_CHECK + "</body>"), encoding="utf-8")
    dom = _run(
        ["--dump-dom", "--virtual-time-budget=15000", "--window-size=1300,1000", probe.resolve().as_uri()],
        page.parent / ".chromium-profile",
    )
    probe.unlink()
    found = re.search(r'data-images="([^"]*)"', dom)
    assert found, "the page never finished loading in chromium"
    return json.loads(html.unescape(found.group(1)))

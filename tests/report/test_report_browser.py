"""The HTML report in a real browser (headless Chromium): the DOM it builds has the tables and
the plots and no element or effect of the script in the data; a screenshot is not blank.

Skipped without chromium unless OPFORGE_REQUIRE_BROWSER=1 (see conftest.browser)."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from opforge.report import write_html
from report_page import parse, table_rows
from report_data import browser, trace_set  # noqa: F401 (fixtures)
from report_data import EVIL, FAST

#: A script the report's data carries sets this attribute on <body> if it ever runs.
PWNED = "data-pwned"


def _chromium(browser: str, tmp_path, *args: str) -> str:
    # A profile folder per call: parallel runs must not share (and lock) the default one.
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
           f"--user-data-dir={profile}", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_detection_works_on_a_page_that_runs_the_script(browser, tmp_path):
    # The same attack unescaped: the browser must run it, or the test below would prove nothing.
    control = tmp_path / "control.html"
    control.write_text(f"<!DOCTYPE html><html><body><p>{EVIL}</p></body></html>", encoding="utf-8")
    dom = parse(_chromium(browser, tmp_path, "--dump-dom", control.as_uri()))
    assert dom.find("body").attrs.get(PWNED) == "1"


def test_browser_dom_has_the_report_and_nothing_injected(browser, trace_set, tmp_path):
    path = write_html(trace_set, tmp_path / "report.html")
    dom = parse(_chromium(browser, tmp_path, "--dump-dom", path.as_uri()))
    body = dom.find("body")
    assert PWNED not in body.attrs
    assert not dom.find_all("script")
    assert [t.attrs["class"] for t in dom.find_all("table")] == ["summary", "status-matrix", "best"]
    assert [r[2].text for r in table_rows(dom.find("table", "summary"))][2] == FAST
    assert EVIL in [th.text for th in dom.find("table", "status-matrix").find_all("th")]
    # The plots are in the DOM as SVG, with their lines and points.
    plots = dom.find_all("svg")
    assert len(plots) == 2 and all(p.find_all("polyline") and p.find_all("circle") for p in plots)


def test_screenshot_is_not_blank(browser, trace_set, tmp_path):
    imread = pytest.importorskip("matplotlib.image").imread  # only to read the screenshot

    path = write_html(trace_set, tmp_path / "report.html")
    shot = tmp_path / "report.png"
    _chromium(browser, tmp_path, "--hide-scrollbars", "--window-size=1400,2600", f"--screenshot={shot}", path.as_uri())
    pixels = imread(shot)
    assert pixels.shape[:2] == (2600, 1400)
    rgb = (pixels[..., :3] * 255).round().astype(np.uint8).reshape(-1, 3)
    colors, counts = np.unique(rgb, axis=0, return_counts=True)
    # Text, table fills and plot lines: many colors, and the page background is far from all of it.
    assert len(colors) > 200, len(colors)
    assert counts.max() / len(rgb) < 0.9
    # The status colors of the matrix are on screen (passed green, runtime-error red).
    on_screen = {tuple(c) for c in colors}
    assert (0xD7, 0xF2, 0xDD) in on_screen and (0xFF, 0xD0, 0xD6) in on_screen

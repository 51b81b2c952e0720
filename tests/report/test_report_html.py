"""The HTML report, read with html.parser: its structure, the numbers and statuses it shows,
that every string from the data is escaped, and that it needs nothing from the network."""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET

import pytest

from opforge.report import render_html, write_html
from report_page import parse, svg_of, table_rows
from report_data import trace_set  # noqa: F401 (a fixture)
from report_data import BROKEN, BUILTIN, DEF, EVIL, EVIL_LOG, FAST, FLAKY, REF, SLOW, STEADY, SUSPECT_REASON, UNUSED

pytest.importorskip("matplotlib")


@pytest.fixture
def page(trace_set, tmp_path):
    path = write_html(trace_set, tmp_path / "out" / "report.html")
    return parse(path.read_text(encoding="utf-8"))


def _section(page):
    (section,) = page.find_all("section", "definition")  # mul_idle has no traces
    return section


def test_page_structure(page):
    assert page.find("title").text == "opforge benchmark report"
    assert [t.attrs["class"] for t in page.find_all("table")] == ["summary", "status-matrix", "best"]
    section = _section(page)
    assert section.find("h2").text == DEF
    nav_links = [a.attrs["href"] for a in page.find("nav").find_all("a")]
    assert nav_links == ["#" + section.attrs["id"]]


def test_header_names_hardware_libraries_and_time_range(page):
    meta = dict(zip((dt.text for dt in page.find_all("dt")), (dd.text for dd in page.find_all("dd"))))
    assert meta["hardware"] == "NVIDIA H200"
    assert meta["devices"] == "cuda:0"
    assert meta["libraries"] == "torch 2.6.0, triton 3.2.0"
    assert meta["runs"] == "2026-03-01 10:01:00 UTC – 2026-03-01 10:40:00 UTC"
    assert meta["traces"].startswith("30 latest traces of 8 solutions on 1 definition")


def test_summary_table(page):
    rows = {r[1].text: [c.text for c in r] for r in table_rows(page.find("table", "summary"))}
    assert list(rows) == [REF, BUILTIN, FAST, STEADY, FLAKY, SLOW, BROKEN, EVIL, UNUSED]
    fast = rows[FAST]
    assert fast[4:] == ["4/4", "–", "20.00", "1,000", "30.0%", "3.76×", "1.75×", "⚠ 1", "NVIDIA H200"]
    assert rows[FLAKY][5] == "1 wrong values, 1 runtime error"
    assert rows[BROKEN][4:6] == ["0/4", "4 compile error"]


def test_status_matrix_shows_every_status_and_the_first_log_line(page):
    table = page.find("table", "status-matrix")
    header = [th.text for th in table.find("thead").find_all("th")]
    assert header[1:] == ["batch=1", "batch=16", "batch=256", "batch=4096"]
    rows = {r[0].text: r[1:] for r in table_rows(table)}
    status = {name: [c.find("span", "status").text for c in cells] for name, cells in rows.items()}
    assert status[FLAKY] == ["PASSED", "INCORRECT_NUMERICAL", "RUNTIME_ERROR", "PASSED"]
    assert status[SLOW] == ["PASSED", "PASSED", "PASSED", "TIMEOUT"]
    assert status[BROKEN] == ["COMPILE_ERROR"] * 4
    assert status[EVIL] == ["RUNTIME_ERROR", "PASSED", "not run", "not run"]
    assert status[UNUSED] == ["not run"] * 4
    assert rows[FLAKY][3].find("span", "num").text == "280.00 µs"
    runtime = rows[FLAKY][2]
    assert "st-runtime_error" in runtime.classes
    assert runtime.find("div", "log").text == "CUDA error: an illegal memory access was encountered"
    assert "at kernel.py:12" in runtime.attrs["title"]  # the rest of the log on hover
    assert "max relative error 0.5" in rows[FLAKY][1].attrs["title"]
    assert "st-timeout" in rows[SLOW][3].classes and "st-compile_error" in rows[BROKEN][0].classes
    assert "★" in rows[FLAKY][0].text and "★" not in rows[STEADY][0].text  # the fastest per workload


def test_suspect_timing_is_marked(page):
    fast = {r[0].text: r[1:] for r in table_rows(page.find("table", "status-matrix"))}[FAST]
    suspect = fast[0]
    assert "suspect" in suspect.classes and "⚠ suspect" in suspect.text
    assert SUSPECT_REASON in suspect.attrs["title"]
    assert not any("suspect" in c.classes for c in fast[1:])
    best_rows = {r[0].text: [c.text for c in r] for r in table_rows(page.find("table", "best"))}
    assert best_rows["batch=1"][1] == FLAKY
    assert best_rows["batch=1"][-1] == f"⚠ suspect timing left out: {FAST}"
    assert best_rows["batch=4096"][1:] == [FAST, "250.00", "1.16×", "4,000", "80.0%", "2.00×", "4.00×", FLAKY,
                                           "+12.0%", ""]
    overall = _section(page).find("p", "overall").text
    assert f"Best overall: {FAST}" in overall and f"runner-up {STEADY} +20.5%" in overall
    assert "left out for suspect timings: batch=1" in overall
    assert "geometric mean over 3 workloads, among 4 solutions that passed every workload" in overall


def test_plots_are_embedded_svg(page):
    imgs = _section(page).find_all("img")
    assert len(imgs) == 2
    latency, bandwidth = (svg_of(img) for img in imgs)
    for svg in (latency, bandwidth):
        root = ET.fromstring(svg)
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        assert not [e for e in root.iter() if e.tag.endswith("script") or any(a.startswith("on") for a in e.attrib)]
    # matplotlib keeps each text as a comment next to its outline: the ticks are the batch sizes
    # on a log x axis, the y axis is log too (latencies span 0.1 to 1000 µs).
    texts = re.findall(r"<!-- (.*?) -->", latency)
    assert texts[:4] == ["1", "16", "256", "4096"]
    assert any(t.startswith(r"$\mathdefault{10^{") for t in texts)
    assert {REF, BUILTIN, FAST, STEADY, FLAKY, SLOW, "suspect timing"} <= set(texts)
    assert BROKEN not in texts and UNUSED not in texts  # nothing passed, nothing to draw
    assert "% of peak bandwidth" in re.findall(r"<!-- (.*?) -->", bandwidth)


def test_data_is_escaped(trace_set, tmp_path):
    text = render_html(trace_set)
    page = parse(text)
    assert not page.find_all("script")
    assert not [e for e in page.iter() if any(a.startswith("on") for a in e.attrs)]
    assert "<script>alert" not in text and "<img src=x" not in text
    # The strings come back whole once unescaped.
    assert EVIL in [th.text for th in page.find("table", "status-matrix").find_all("th")]
    cell = {r[0].text: r[1] for r in table_rows(page.find("table", "status-matrix"))}[EVIL]
    assert cell.find("div", "log").text == EVIL_LOG.splitlines()[0]
    assert cell.attrs["title"] == EVIL_LOG


def test_self_contained(page):
    assert not page.find_all("link") and not page.find_all("script")
    for element in page.iter():
        for name, value in element.attrs.items():
            if name in ("src", "href"):
                assert value.startswith(("#", "data:")), (element.tag, value[:80])
    csp = [m.attrs["content"] for m in page.find_all("meta") if m.attrs.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0]


def test_filters_apply_to_the_page(trace_set):
    page = parse(render_html(trace_set, solutions=[FAST, STEADY], title="two"))
    assert page.find("title").text == "two"
    assert [r[1].text for r in table_rows(page.find("table", "summary"))] == [FAST, STEADY]
    assert [r[0].text for r in table_rows(page.find("table", "status-matrix"))] == [FAST, STEADY]


def test_a_report_without_traces(trace_set):
    page = parse(render_html(trace_set, definitions=["mul_idle"]))
    assert not page.find_all("section", "definition")
    assert "No evaluated traces match." in page.text


def test_without_matplotlib_the_error_says_what_to_install(trace_set, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=re.escape("pip install matplotlib")):
        write_html(trace_set, tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


def test_latency_plot_has_the_reference_line(trace_set):  # noqa: F811 (a fixture)
    from opforge.report.html import _reference_series
    from opforge.report.select import collect

    view = next(v for v in collect(trace_set) if v.name == DEF)
    series = _reference_series(view)
    assert series.name == REF
    assert sorted((p.x, round(p.y, 6)) for p in series.points) == [(1.0, 10.0), (16.0, 20.0), (256.0, 80.0),
                                                                      (4096.0, 1000.0)]

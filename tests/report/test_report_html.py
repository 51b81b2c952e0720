"""The HTML report, read with html.parser: its structure, the numbers and statuses it shows,
that every string from the data is escaped, and that it needs nothing from the network."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

import pytest

from opforge.report import render_html, write_html
from report_page import parse, svg_texts, svgs, table_rows
from report_data import trace_set  # noqa: F401 (a fixture)
from report_data import (BROKEN, BUILTIN, DEF, EVIL, EVIL_LOG, FAST, FLAKY, REF, SLOW, STEADY, SUSPECT_REASON, UNTRACED,
                         UNUSED)

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def page_text(trace_set, tmp_path):
    path = write_html(trace_set, tmp_path / "out" / "report.html")
    return path.read_text(encoding="utf-8")


@pytest.fixture
def page(page_text):
    return parse(page_text)


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
    # 9 solutions x 5 workloads, 30 traced; mul_idle has a workload and a solution but no trace.
    assert meta["not run"] == "15 solution-workload pairs in the definitions shown; 1 definition with no trace at " \
                              "all: mul_idle"


def test_the_page_says_which_way_speedups_point(page):
    key = page.find("section").text  # the first section: how to read the page
    assert "Speedups (vs reference, vs baseline): above 1× is faster, below 1× slower" in key
    summary = next(s for s in page.find_all("section") if s.attrs.get("id") == "summary")
    assert "above 1× is faster" in summary.find("p").text
    assert "Not run means no trace in the dataset: the run skipped it" in key


def test_the_definition_names_its_dtypes_and_what_was_not_run(page):
    section = _section(page)
    about = section.find("p", "muted")
    assert "dtype float32 → float32" in about.text
    assert about.attrs["title"] == "inputs: x float32, w float32; outputs: y float32"
    assert section.find("p", "not-run").text == f"Not run by any solution (1 of 5 workloads): batch={UNTRACED}"


def test_summary_table(page):
    table = page.find("table", "summary")
    head = [th.text for th in table.find("thead").find_all("th")]
    assert head[:8] == ["definition", "dtype", "solution", "author", "language", "passed", "failures", "not run"]
    assert "hardware" not in head  # one machine: it is in the header
    cells = {r[2].text: r for r in table_rows(table)}
    rows = {name: [c.text for c in r] for name, r in cells.items()}
    assert list(rows) == [REF, BUILTIN, FAST, STEADY, FLAKY, SLOW, BROKEN, EVIL, UNUSED]
    fast = rows[FAST]
    assert fast[1] == "float32 → float32"
    # Passed counts every workload of the dataset; the one no solution ran is counted and named.
    assert fast[5:] == ["4/5", "–", "1", "20.00", "1,000", "30.0%", "3.76×", "1.75×", "⚠ 1"]
    assert cells[FAST][7].attrs["title"] == f"batch={UNTRACED}"
    assert rows[FLAKY][6] == "1 wrong values, 1 runtime error"
    assert rows[BROKEN][5:8] == ["0/5", "4 compile error", "1"]
    assert rows[EVIL][5:8] == ["1/5", "1 runtime error", "3"]
    assert cells[EVIL][7].attrs["title"] == f"batch=256, batch=4096, batch={UNTRACED}"
    assert rows[UNUSED][5:8] == ["0/5", "–", "5"]


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


def test_plots_are_inline_svg_with_one_legend(page, page_text):
    section = _section(page)
    assert not section.find_all("img") and len(section.find_all("svg")) == 2
    latency, bandwidth = svgs(page_text)
    for svg in (latency, bandwidth):
        root = ET.fromstring(svg)  # well-formed XML
        assert root.tag == SVG + "svg"
        assert not [e for e in root.iter() if e.tag.endswith("script") or any(a.startswith("on") for a in e.attrib)]
    # The latencies span 0.1 to 1000 µs: a log y axis with labelled decades; the x ticks are the
    # batch sizes that were run (a log axis too, 1 to 4096), the untraced one is not drawn.
    texts = svg_texts(latency)
    assert texts[0] == f"{DEF}: latency"
    assert {"0.1", "1", "10", "100", "1,000"} <= set(texts)
    assert [t for t in texts if t in ("1", "16", "256", "4096", str(UNTRACED))] == ["1", "1", "16", "256", "4096"]
    assert texts[-2:] == ["batch", "latency (µs)"]
    # One line per solution with two or more passed timings (EVIL has one: a point); the
    # reference is a solution here, so no dashed reference line doubles it. The legend names them.
    root = ET.fromstring(latency)
    lines = root.findall(f"{SVG}polyline")
    assert len(lines) == 6 and not any(line.attrib.get("stroke-dasharray") for line in lines)
    legend = [li.text for li in section.find("ul", "legend").find_all("li")]
    assert legend == [REF, BUILTIN, FAST, STEADY, FLAKY, SLOW, EVIL, "✕suspect timing (off the line)"]
    assert BROKEN not in legend and UNUSED not in legend  # nothing passed, nothing to draw
    colors = {li.text: li.find("span").attrs["style"] for li in section.find("ul", "legend").find_all("li")}
    assert len(set(colors.values())) == len(colors)
    # Each point's value is in its tooltip; the suspect one says why.
    tips = [t.text for t in root.iter(f"{SVG}title")]
    assert f"{STEADY}, batch=16: 7 µs (p10–p90 6.65 µs – 7.7 µs)" in tips
    assert f"{REF}, batch=4096: 1,000 µs (p10–p90 950 µs – 1,100 µs)" in tips
    assert not any("e+" in tip or "e-" in tip for tip in tips)  # never in exponent notation
    assert f"{FAST}, batch=1: 0.1 µs (p10–p90 0.095 µs – 0.11 µs); suspect timing: {SUSPECT_REASON}" in tips
    assert "% of peak bandwidth" in svg_texts(bandwidth)


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
    ids = [e.attrs["id"] for e in page.iter() if "id" in e.attrs]  # links and plots rely on unique ids
    assert len(ids) == len(set(ids))


def test_filters_apply_to_the_page(trace_set):
    text = render_html(trace_set, solutions=[FAST, STEADY], title="two")
    page = parse(text)
    assert page.find("title").text == "two"
    # Without the reference among the solutions, its recorded latency is the dashed line.
    lines = ET.fromstring(svgs(text)[0]).findall(f"{SVG}polyline")
    assert len(lines) == 3 and lines[-1].attrib["stroke-dasharray"]
    assert [li.text for li in page.find("ul", "legend").find_all("li")][-2] == REF
    assert [r[2].text for r in table_rows(page.find("table", "summary"))] == [FAST, STEADY]
    assert [r[0].text for r in table_rows(page.find("table", "status-matrix"))] == [FAST, STEADY]


def test_a_report_without_traces(trace_set):
    page = parse(render_html(trace_set, definitions=["mul_idle"]))
    assert not page.find_all("section", "definition")
    assert "No evaluated traces match." in page.text


def test_the_page_needs_no_matplotlib(trace_set, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert len(svgs(write_html(trace_set, tmp_path / "r.html").read_text(encoding="utf-8"))) == 2


def test_latency_plot_has_the_reference_line(trace_set):  # noqa: F811 (a fixture)
    from opforge.report.figures import reference_series
    from opforge.report.select import collect

    view = next(v for v in collect(trace_set) if v.name == DEF)
    series = reference_series(view)
    assert series.name == REF
    assert sorted((p.x, round(p.y, 6)) for p in series.points) == [(1.0, 10.0), (16.0, 20.0), (256.0, 80.0),
                                                                      (4096.0, 1000.0)]


def test_each_gpu_model_gets_its_own_section(trace_set):
    """A dataset measured on two GPU models: each model's traces are a section of their own,
    linked from the navigation and from their summary rows."""
    from report_data import passed

    h100 = "NVIDIA H100 80GB HBM3"
    trace_set.add_trace(passed(FAST, 16, 0.012, timestamp="2026-04-01T00:00:00Z", hardware=h100))
    page = parse(render_html(trace_set))
    sections = page.find_all("section", "definition")
    assert [s.find("h2").text for s in sections] == [f"{DEF} on NVIDIA H200", f"{DEF} on {h100}"]
    ids = ["#" + s.attrs["id"] for s in sections]
    assert len(set(ids)) == 2 and [a.attrs["href"] for a in page.find("nav").find_all("a")] == ids
    fast = [row for row in table_rows(page.find("table", "summary")) if row[2].text == FAST]
    assert [(row[0].find("a").attrs["href"], row[-1].text) for row in fast] == \
        [(ids[0], "NVIDIA H200"), (ids[1], h100)]
    # The H100 section holds only what was measured there: one workload, FAST's 12 µs.
    (matrix,) = sections[1].find_all("table", "status-matrix")
    assert "12.00 µs" in matrix.text and "20.00 µs" not in matrix.text

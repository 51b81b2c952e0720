"""How noisy each timing was (p90/p10 spread, slowest run over the median) and speedups whose
baseline was timed in an earlier run, in the tables, the terminal output, the HTML page and
its latency plot; traces without those keys (older writers) still report.

The dataset: ``mul_h8`` on four batch sizes (latencies in ms), the builtin as baseline:

    solution   batch=1   batch=16       batch=256  batch=4096
    builtin    0.005     0.008          0.040      0.500
    steady     0.004     0.007          0.025 (E)  0.300 (E)   (E: baseline from an earlier run)
    noisy      0.0045    0.001 (spread) 0.030      0.350       (spread: suspect, p90/p10 36x)
    old        0.006     0.009          0.050      0.600       (no spread recorded)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from rich.console import Console

from opforge.report import best, print_best, print_summary, render_html, rows_to_json, summarize
from opforge.report.stats import earlier_baseline, max_over_median, spread, timing_range
from opforge.trace import TraceSet
from report_page import parse, svgs, table_rows
from report_data import BATCHES, BUILTIN, BUILTIN_MS, DEF, KERNEL, mul_definition, passed, solution, workload

STEADY, NOISY, OLD = f"{DEF}_steady", f"{DEF}_noisy", f"{DEF}_old"
STEADY_MS = {1: 0.004, 16: 0.007, 256: 0.025, 4096: 0.3}
NOISY_MS = {1: 0.0045, 16: 0.001, 256: 0.030, 4096: 0.35}
OLD_MS = {1: 0.006, 16: 0.009, 256: 0.05, 4096: 0.6}
EARLIER_AT = "2026-02-27T08:00:00Z"
EARLIER = f"{EARLIER_AT}, seed 7"
HIGH_SPREAD = "high spread: p90/p10 36.0x, max/median 203x (a loaded machine?)"
# Older writers: no timing at all, only p10, or none of the spread keys.
OLD_TIMING = {1: None, 16: None, 256: {"p10_ms": 0.049}, 4096: {"iterations": 5}}


def _timing(ms: float, p10: float, p90: float, max_ms: float, **extra) -> dict:
    """The timing dict of the runner (bench/timing.py), plus ``extra``."""
    return {"method": "cuda_events", "median_ms": ms, "p10_ms": p10, "p90_ms": p90, "min_ms": p10 * 0.9,
            "max_ms": max_ms, "stdev_ms": (p90 - p10) / 2, "iterations": 200, **extra}


def _steady(batch: int):
    ms = STEADY_MS[batch]
    extra = {"baseline_earlier": {"timestamp": EARLIER_AT, "seed": 7}} if batch >= 256 else {}
    return passed(STEADY, batch, ms, minute=3, timing=_timing(ms, ms * 0.98, ms * 1.06, ms * 1.5, **extra))


def _noisy(batch: int):
    ms = NOISY_MS[batch]
    if batch == 16:  # would be 8x the baseline if its timing were believed
        return passed(NOISY, batch, ms, minute=4, suspect=HIGH_SPREAD, timing=_timing(ms, 0.0005, 0.018, 0.203))
    return passed(NOISY, batch, ms, minute=4, timing=_timing(ms, ms * 0.97, ms * 1.03, ms * 1.1))


def build() -> TraceSet:
    ts = TraceSet(definitions=[mul_definition(DEF)])
    for name in (STEADY, NOISY, OLD, BUILTIN):
        ts.add_solution(solution(name, KERNEL, definition=DEF))
    for b in BATCHES:
        ts.add_workload(DEF, workload(b))
        ts.add_trace(passed(BUILTIN, b, BUILTIN_MS[b], minute=2))
        ts.add_trace(_steady(b))
        ts.add_trace(_noisy(b))
        old = passed(OLD, b, OLD_MS[b], minute=5)
        old.evaluation.performance.timing = OLD_TIMING[b]
        ts.add_trace(old)
    return ts


@pytest.fixture
def traces():
    return build()


def _text(print_rows, rows, width: int = 250) -> str:
    console = Console(record=True, width=width, color_system=None)
    print_rows(rows, console=console)
    return console.export_text()


def _line(text: str, *needles: str) -> str:
    (line,) = [line for line in _lines(text) if all(n in line for n in needles)]
    return line


def _lines(text: str) -> list[str]:
    # rich pads a caption to the table's width
    return [line.rstrip() for line in text.splitlines()]


# --- the numbers -------------------------------------------------------------------------------


def test_spread_and_the_slowest_run_from_the_timing_keys(traces):
    noisy = _noisy(16)
    assert timing_range(noisy) == (0.0005, 0.018)
    assert spread(noisy) == pytest.approx(36.0)
    assert max_over_median(noisy) == pytest.approx(203.0)
    assert earlier_baseline(noisy) is None
    assert earlier_baseline(_steady(256)) == EARLIER and earlier_baseline(_steady(1)) is None


@pytest.mark.parametrize("timing", [None, {}, {"p10_ms": 0.049}, {"p10_ms": 0.002, "p90_ms": 0.001},
                                    {"p10_ms": "fast", "p90_ms": 0.01}, {"p10_ms": 0.0, "p90_ms": 0.01},
                                    {"p10_ms": float("nan"), "p90_ms": 0.01}])
def test_missing_or_unusable_keys_give_no_spread(timing):
    trace = passed(OLD, 16, 0.009)
    trace.evaluation.performance.timing = timing
    assert timing_range(trace) is spread(trace) is max_over_median(trace) is earlier_baseline(trace) is None


def test_the_slowest_run_falls_back_on_the_latency_for_the_median():
    assert max_over_median(passed(OLD, 16, 0.01, timing={"max_ms": 0.03})) == pytest.approx(3.0)


@pytest.mark.parametrize("earlier, label", [({"timestamp": EARLIER_AT, "seed": None}, EARLIER_AT),
                                            ({"seed": 3}, "time not recorded, seed 3"),
                                            ("yes", "time not recorded")])
def test_an_earlier_baseline_is_marked_whatever_else_it_records(earlier, label):
    assert earlier_baseline(passed(OLD, 16, 0.01, timing={"baseline_earlier": earlier})) == label


def test_rows_count_the_ratios_with_an_earlier_baseline(traces):
    rows = {r.solution: r for r in summarize(traces)}
    steady = rows[STEADY]
    assert (steady.baseline_ratios, steady.baseline_earlier) == (4, [EARLIER, EARLIER])
    assert (rows[OLD].baseline_ratios, rows[OLD].baseline_earlier) == (4, [])
    # The high-spread timing is counted as suspect and kept out of the means: no 8x speedup.
    noisy = rows[NOISY]
    assert noisy.suspect == 1 and noisy.baseline_ratios == 3
    assert noisy.speedup_vs_baseline == pytest.approx((0.005 / 0.0045 * 0.04 / 0.03 * 0.5 / 0.35) ** (1 / 3))

    by_workload = {r.workload: r for r in best(traces)}
    sixteen = by_workload["batch=16"]
    assert (sixteen.solution, sixteen.suspect) == (STEADY, [NOISY])
    assert sixteen.spread == pytest.approx(1.06 / 0.98) and sixteen.max_over_median == pytest.approx(1.5)
    assert (sixteen.baseline_ratios, sixteen.baseline_earlier) == (1, [])
    assert by_workload["batch=256"].baseline_earlier == [EARLIER]
    overall = by_workload["(overall)"]
    assert (overall.solution, overall.workloads_compared) == (STEADY, 3)
    assert (overall.baseline_ratios, overall.baseline_earlier) == (3, [EARLIER, EARLIER])
    assert overall.spread is None

    as_json = rows_to_json(best(traces, solutions=[OLD]))
    assert as_json[0]["spread"] is None and as_json[0]["max_over_median"] is None
    assert json.loads(json.dumps(rows_to_json(best(traces)), allow_nan=False))[2]["baseline_earlier"] == [EARLIER]


# --- the terminal ------------------------------------------------------------------------------


def test_terminal_summary_marks_means_over_earlier_baselines(traces):
    text = _text(print_summary, summarize(traces))
    assert "1.40×* (2/4)" in _line(text, f" {STEADY} ")
    assert "*" not in _line(text, f" {OLD} ")
    assert _line(text, f" {NOISY} ").rstrip(" │").endswith("1")  # the #suspect column
    assert (f"* baseline timed in an earlier run ({EARLIER}); (n/m): n of the m averaged ratios"
            in _lines(text))


def test_terminal_best_shows_the_spread_and_marks_earlier_baselines(traces):
    text = _text(print_best, best(traces))
    assert "spread p90/p10" in text
    one = _line(text, "│ batch=1 ")
    assert f" {STEADY} " in one and " 1.08× " in one and " 1.25× " in one and "*" not in one
    assert f"suspect: {NOISY}" in _line(text, "│ batch=16 ")
    assert " 1.60×* " in _line(text, "│ batch=256 ") and " 1.67×* " in _line(text, "│ batch=4096 ")
    assert f"* baseline timed in an earlier run ({EARLIER})" in _lines(text)
    overall = _line(text, f"│ {DEF} ", " 1.00× ")
    assert re.search(r" \d\.\d\d×\* \(2/3\) ", overall), overall
    assert f"* baseline timed in an earlier run ({EARLIER}); (n/m): n of the m averaged ratios" in _lines(text)


def _cells(line: str, bar: str) -> list[str]:
    return [c.strip() for c in line.strip().strip(bar).split(bar)]


def test_terminal_best_without_spread_keys(traces):
    text = _text(print_best, best(traces, solutions=[OLD]))
    header = _cells(_line(text, "┃ definition ┃ workload "), "┃")
    for batch in ("1", "16", "256", "4096"):
        row = dict(zip(header, _cells(_line(text, f"│ batch={batch} "), "│")))
        assert (row["best"], row["spread p90/p10"]) == (OLD, "–"), text
    assert "earlier run" not in text


def test_piped_output_keeps_whole_rows(tmp_path):
    """Piped into a log, no row folds into the 80 columns rich assumes without a terminal."""
    path = build().save(tmp_path / "results.json")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    for command in ("summary", "best"):
        done = subprocess.run([sys.executable, "-m", "opforge.report", command, "--dataset", str(path)],
                              capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        # One line per row: the summary's, and the four workloads' and the overall row of best.
        assert sum(STEADY in line for line in lines) == (1 if command == "summary" else 5), done.stdout
        if command == "summary":
            assert "1.40×* (2/4)" in _line(done.stdout, f" {STEADY} ")
        else:
            assert " 1.60×* " in _line(done.stdout, "│ batch=256 ", STEADY, "+")


# --- the HTML page -----------------------------------------------------------------------------


@pytest.fixture
def page_text(traces):
    return render_html(traces)


@pytest.fixture
def page(page_text):
    return parse(page_text)


def test_html_best_table_has_the_spread_and_marks_earlier_baselines(page):
    table = page.find("table", "best")
    head = [th.text for th in table.find("thead").find_all("th")]
    rows = {r[0].text: r for r in table_rows(table)}
    spread_at, vs_at = head.index("spread (p90/p10)"), head.index("vs baseline")
    one = rows["batch=1"]
    assert (one[1].text, one[spread_at].text, one[vs_at].text) == (STEADY, "1.08×", "1.25×")
    assert one[spread_at].attrs["title"] == "p90/p10 of the timed runs 1.08×; slowest run 1.50× the median"
    marked = rows["batch=256"][vs_at]
    assert marked.text == "1.60×*"
    assert f"against a baseline timed in an earlier run: {EARLIER}" in marked.attrs["title"]
    section = page.find("section", "definition")
    footnote = [p.text for p in section.find_all("p", "footnote")]
    assert footnote == [f"* baseline timed in an earlier run ({EARLIER})"]
    overall = section.find("p", "overall").text
    assert f"(2 of 3 ratios against a baseline timed in an earlier run: {EARLIER})" in overall


def test_html_summary_marks_means_over_earlier_baselines_and_counts_suspects(page):
    table = page.find("table", "summary")
    head = [th.text for th in table.find("thead").find_all("th")]
    rows = {r[head.index("solution")].text: r for r in table_rows(table)}
    vs_at = head.index("vs baseline (geomean)")
    assert rows[STEADY][vs_at].text == "1.40×* (2/4)"
    assert "2 of 4 ratios against a baseline timed in an earlier run" in rows[STEADY][vs_at].attrs["title"]
    assert "*" not in rows[OLD][vs_at].text
    assert rows[NOISY][head.index("suspect timings")].text == "⚠ 1"
    (footnote,) = next(s for s in page.find_all("section") if s.attrs.get("id") == "summary").find_all("p", "footnote")
    assert footnote.text == f"* baseline timed in an earlier run ({EARLIER}); (n/m): n of the m averaged ratios"


def test_html_status_cells_show_the_spread_and_the_high_spread_reason(page):
    cells = {r[0].text: r[1:] for r in table_rows(page.find("table", "status-matrix"))}
    noisy = cells[NOISY][1]
    assert "suspect" in noisy.classes and "⚠ suspect" in noisy.text
    assert noisy.find("span", "spread").text == "spread 36.00×"
    title = noisy.attrs["title"]
    assert f"suspect timing: {HIGH_SPREAD}" in title
    assert "p10–p90 0.5–18.00 µs, p90/p10 of the timed runs 36.00×; slowest run 203.00× the median" in title
    steady = cells[STEADY][2]
    assert f"vs {BUILTIN} 1.60×* (baseline timed in an earlier run: {EARLIER})" in steady.attrs["title"]
    assert "earlier run" not in cells[STEADY][0].attrs["title"]
    old = cells[OLD]
    assert not any(c.find_all("span", "spread") or "p10" in c.attrs["title"] for c in old)


def test_html_latency_plot_draws_the_p10_p90_bars(page, page_text):
    section = page.find("section", "definition")
    latency = svgs(page_text)[0]
    assert "bars span p10 to p90" in section.find("figcaption").text
    groups = {g.attrib["data-series"]: g for g in ET.fromstring(latency).iter("{http://www.w3.org/2000/svg}g")
              if g.attrib.get("class") == "p10-p90"}
    # Series in report order: builtin, steady, noisy, old, then the reference line (no ranges).
    # The builtin's traces have p10 and p90 (report_data's default), old's have not.
    assert sorted(groups) == ["0", "1", "2"]
    assert all(len(list(g.iter("{http://www.w3.org/2000/svg}path"))) == 4 for g in groups.values())


def _bar_lengths(svg: str, series: str) -> list[float]:
    """The on-screen length of each bar (the first, vertical, stroke of each path) of a series."""
    group = next(g for g in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}g")
                 if g.attrib.get("class") == "p10-p90" and g.attrib["data-series"] == series)
    lengths = []
    for path in group.iter("{http://www.w3.org/2000/svg}path"):
        _, y0, y1 = map(float, re.match(r"M([-\d.]+) ([-\d.]+)V([-\d.]+)", path.attrib["d"]).groups())
        lengths.append(abs(y1 - y0))
    return lengths


def test_line_plot_bars_span_the_given_range():
    from opforge.report.plots import Point, Series, line_plot

    # A linear axis (under 10x) from zero: on screen the bars are as long as their ranges, 2 and 6.
    svg = line_plot([Series("a", [Point(1, 10, False, 9, 11), Point(2, 20, True, 14, 20)]),
                     Series("b", [Point(1, 12), Point(2, 13)])], xlabel="x", ylabel="y", title="t")
    short, long = _bar_lengths(svg, "0")
    assert long / short == pytest.approx(3.0, rel=1e-2)
    assert 'data-series="1"' not in svg


def test_line_plot_axes():
    from opforge.report.plots import Point, Series, line_plot, tick_label

    def ticks(svg):
        return [t for t in re.findall(r'class="end">([^<]*)<', svg)]

    # Under 10x: linear from zero, so a 2.2% and a 2.7% do not look 5x apart.
    narrow = line_plot([Series("a", [Point(1, 2.2), Point(8, 2.7)])], xlabel="x", ylabel="%", title="t")
    assert ticks(narrow)[0] == "0"
    # Over 10x, bars included: logarithmic, labelled in plain numbers.
    wide = line_plot([Series("a", [Point(1, 20, False, 15, 400), Point(8, 30)])], xlabel="x", ylabel="µs", title="t")
    assert "0" not in ticks(wide) and {"20", "50", "100", "200"} <= set(ticks(wide))
    assert [tick_label(v) for v in (0.5, 20, 1000, 25000, 200000)] == ["0.5", "20", "1,000", "25k", "200k"]
    assert line_plot([Series("a", [])], xlabel="x", ylabel="y", title="t") is None

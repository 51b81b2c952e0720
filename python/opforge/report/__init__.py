"""Reports of benchmark results: tables, a JSON form and a self-contained HTML page made from
the traces of a dataset (a TraceSet folder or .json file).

Only the latest trace per (definition, workload, solution) counts, so rerunning a solution
replaces its old results. Timings marked suspect are shown but never win and never enter a
mean. The per-workload tables and the latency plots show how noisy each timing was (p90/p10
of its runs); a speedup whose baseline was timed in an earlier run is marked "*"; a speedup
above 1x means faster. Workloads of the dataset without a trace (the runner writes none for
what it skips) are counted and named as "not run". From the command line:
``opforge report summary|best|html`` (see report/cli.py).

    from opforge.report import summarize, best, write_html, print_summary
    ts = TraceSet.load("opforge-runs/builtin")
    print_summary(summarize(ts, definitions=["rmsnorm_*"]))
    write_html(ts, "report.html")

The HTML page writes its plots as inline SVG itself (report/plots.py): the page of the
built-in dataset's run renders in about 0.1 s and weighs a few hundred KB.
"""

from .best import BestRow, best, best_of
from .console import print_best, print_summary
from .html import render_html, write_html
from .rows import rows_to_json
from .select import collect, latest_traces, workload_label
from .summary import SummaryRow, summarize, summary_rows

__all__ = ["BestRow", "SummaryRow", "best", "best_of", "collect", "latest_traces", "print_best", "print_summary",
           "render_html", "rows_to_json", "summarize", "summary_rows", "workload_label", "write_html"]

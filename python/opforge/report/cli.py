"""``opforge report``: tables, JSON or an HTML page of a dataset's benchmark results.

    opforge report summary [--dataset PATH] [--definitions NAME ...] [--solutions NAME ...]
                           [--hardware TEXT] [--json]
    opforge report best    [same options]
    opforge report html    [same options, no --json] [-o report.html] [--title TEXT]
    python -m opforge.report ...    (the same, without the opforge command)

Without --dataset the results of ``opforge run`` on the built-in dataset are read
(./opforge-runs/builtin). Names in --definitions and --solutions may be glob patterns
("rmsnorm_*"). Exit status: 0 done, 1 nothing to report, 2 bad arguments or an unreadable dataset.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from ..bench.cli import BUILTIN_OUTPUT as DEFAULT_DATASET  # where `opforge run` writes the built-in results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the report subcommands to ``parser`` (``opforge report`` or ``python -m opforge.report``)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dataset", type=Path, metavar="PATH",
                        help=f"dataset folder or .json file (default: ./{DEFAULT_DATASET.as_posix()} when it exists)")
    common.add_argument("--definitions", nargs="+", metavar="NAME", help="only these definitions (names or globs)")
    common.add_argument("--solutions", nargs="+", metavar="NAME", help="only these solutions (names or globs)")
    common.add_argument("--hardware", metavar="TEXT", help="only traces whose hardware name contains TEXT")
    commands = parser.add_subparsers(dest="report_command", metavar="{summary,best,html}", required=True)
    summary = commands.add_parser("summary", parents=[common], help="one row per definition and solution",
                                  description="One row per definition and solution: passed workloads, failures, "
                                              "median latency, GB/s and % of peak, geomean speedups.")
    summary.add_argument("--json", action="store_true", help="print the rows as JSON")
    best = commands.add_parser("best", parents=[common], help="the fastest solution per workload and overall",
                               description="The fastest passing solution per workload (suspect timings left "
                                           "out) with the spread of its timing, its runner-up, and the best "
                                           "solution of each definition overall.")
    best.add_argument("--json", action="store_true", help="print the rows as JSON")
    page = commands.add_parser("html", parents=[common], help="a self-contained HTML report with plots",
                               description="Write one HTML file with the summary (dtypes, workloads not run), "
                                           "latency and bandwidth plots, status matrices and the best solutions.")
    page.add_argument("-o", "--output", type=Path, default=Path("report.html"), metavar="FILE",
                      help="where to write it (default: report.html)")
    page.add_argument("--title", default="opforge benchmark report", help="title of the page")


def _fail(message: str, code: int) -> int:
    print(f"opforge report: {message}", file=sys.stderr)
    return code


def _dataset(args) -> Optional[Path]:
    if args.dataset is not None:
        return args.dataset
    return DEFAULT_DATASET if DEFAULT_DATASET.is_dir() else None


def run(args: argparse.Namespace) -> int:
    from ..trace import TraceSet
    from . import best_of, collect, fmt, print_best, print_summary, rows_to_json, summary_rows, write_html

    path = _dataset(args)
    if path is None:
        return _fail(f"no dataset: ./{DEFAULT_DATASET.as_posix()} (where `opforge run` writes its results) does "
                     "not exist here; pass --dataset PATH (a dataset folder or a .json file)", 2)
    try:
        trace_set = TraceSet.load(path, check_blobs=False)
    except (OSError, ValueError) as exc:
        return _fail(f"cannot read {path}: {exc}", 2)
    if trace_set.load_errors:
        print(f"opforge report: warning: skipped {len(trace_set.load_errors)} bad files or lines in {path}",
              file=sys.stderr)
    try:
        views = collect(trace_set, args.definitions, args.solutions, args.hardware)
    except ValueError as exc:
        return _fail(str(exc), 2)
    if not views:
        filtered = any(v is not None for v in (args.definitions, args.solutions, args.hardware))
        return _fail(f"no evaluated traces in {path}{' match the filters' if filtered else ''}", 1)

    if args.report_command == "html":
        out = write_html(trace_set, args.output, args.definitions, args.solutions, args.hardware, title=args.title)
        traces = sum(len(v.cells) for v in views)
        print(f"wrote {out} ({fmt.count(len(views), 'definition')}, {fmt.count(traces, 'trace')})")
        return 0
    if args.report_command == "summary":
        rows, show = [r for v in views for r in summary_rows(v)], print_summary
    else:
        rows, show = [r for v in views for r in best_of(v)], print_best
    if args.json:
        print(json.dumps(rows_to_json(rows), indent=2, allow_nan=False))
    else:
        show(rows)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m opforge.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))

"""The ``opforge`` command. Subcommands:

    opforge run [options]       benchmark every solution of a dataset (default: the built-in one)
    opforge report summary|best|html   what the recorded Traces say (tables, an HTML page with plots)
    opforge smoke [names...]    run solutions once against their Definitions' references
    opforge info                what this build contains
    opforge selfcheck           every op on every device against its reference (also `python -m opforge`)
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="opforge", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    from . import smoke_test
    from .bench import cli as run_cli

    run = commands.add_parser("run", help="benchmark solutions and record Traces",
                              description=run_cli.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run_cli.add_arguments(run)
    run.set_defaults(run=run_cli.run)
    from .report import cli as report_cli

    report = commands.add_parser("report", help="summaries, the best solutions and an HTML report of Traces")
    report_cli.add_arguments(report)
    report.set_defaults(run=report_cli.run)
    smoke = commands.add_parser("smoke", help="smoke-test solutions against the references")
    smoke_test.add_arguments(smoke)
    smoke.set_defaults(run=smoke_test.run)
    info = commands.add_parser("info", help="what this build of opforge contains")
    info.set_defaults(run=lambda args: print(json.dumps(__import__("opforge").build_info(), indent=2)) or 0)
    selfcheck = commands.add_parser("selfcheck", help="check every op on every device against its reference")
    selfcheck.set_defaults(run=lambda args: __import__("opforge.__main__", fromlist=["main"]).main())
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

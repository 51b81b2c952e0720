"""The ``opforge`` command. Subcommands:

    opforge smoke [names...]    run solutions once against their Definitions' references
    opforge info                what this build contains
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

    smoke = commands.add_parser("smoke", help="smoke-test solutions against the references")
    smoke_test.add_arguments(smoke)
    smoke.set_defaults(run=smoke_test.run)
    info = commands.add_parser("info", help="what this build of opforge contains")
    info.set_defaults(run=lambda args: print(json.dumps(__import__("opforge").build_info(), indent=2)) or 0)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

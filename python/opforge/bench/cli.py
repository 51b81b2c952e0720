"""``opforge run``: benchmark every solution of a dataset and append the Traces to it.

    opforge run                                   # the built-in dataset, into ./opforge-runs/builtin
    opforge run --dataset my_dataset --definitions rmsnorm_h4096 --devices cuda:0 cuda:1
    opforge run --module my_kernels.py --solutions my_rmsnorm --resume
    opforge run --dataset my_dataset --ray auto   # every GPU of the Ray cluster this machine is in

Results go to the dataset's traces/ (``--output DIR`` to write a copy of the dataset elsewhere;
the built-in dataset always goes to a copy, by default ./opforge-runs/builtin). Settings come
from ``--config FILE`` (see opforge.bench.config) with the options here on top.
"""

from __future__ import annotations

import argparse
from pathlib import Path

#: Where a run of the built-in dataset writes, relative to the current directory.
BUILTIN_OUTPUT = Path("opforge-runs") / "builtin"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", help="dataset folder or .json file (default: the built-in dataset)")
    parser.add_argument("--output", help=f"dataset folder to write to (a copy of --dataset when new; default for "
                        f"the built-in dataset: {BUILTIN_OUTPUT})")
    parser.add_argument("--definitions", nargs="+", help="only these definitions")
    parser.add_argument("--solutions", nargs="+", help="only these solutions")
    parser.add_argument("--devices", nargs="+", help="cpu, cuda, cuda:N (default: every GPU, else the CPU)")
    parser.add_argument("--module", action="append", default=[],
                        help="module or .py file registering solutions (imported only in the workers; repeatable)")
    parser.add_argument("--config", help="TOML or JSON settings file (see opforge.bench.config)")
    parser.add_argument("--resume", action="store_true", help="skip solution/workload pairs already traced")
    parser.add_argument("--builtin", action="store_true",
                        help="add opforge's own ops as solutions of the dataset's definitions whose names it knows "
                        "(e.g. the public rmsnorm_h4096), saved into the dataset")
    parser.add_argument("--seed", type=int, help="seed of the inputs (default: random, recorded in each trace)")
    parser.add_argument("--baseline", help='solution to compare with ("builtin" by default; "none" for none)')
    parser.add_argument("--isolate", action="store_true", help="a fresh worker process for every solution and workload (every "
                        "solution always has worker processes of its own)")
    parser.add_argument("--max-elements", type=int, help="skip workloads with a larger tensor")
    parser.add_argument("--no-reference-timing", action="store_true", help="do not time the reference")
    parser.add_argument("--log-dir", help="worker logs (default: DATASET/logs)")
    from .cluster import cli as cluster_cli

    cluster_cli.add_arguments(parser)
    group = parser.add_argument_group("settings (override the config file)")
    group.add_argument("--iterations", type=int)
    group.add_argument("--warmup", type=int)
    group.add_argument("--input-sets", type=int)
    group.add_argument("--timeout", type=float, dest="timeout_s", help="seconds per worker request")
    group.add_argument("--max-time", type=float, dest="max_time_s", help="timing budget per pair, seconds")
    group.add_argument("--no-cuda-graph", action="store_false", dest="cuda_graph", default=None)
    group.add_argument("--no-flush-l2", action="store_false", dest="flush_l2", default=None)


SETTING_OPTIONS = ("iterations", "warmup", "input_sets", "timeout_s", "max_time_s", "cuda_graph", "flush_l2")


def config_from(args: argparse.Namespace):
    from .config import BenchmarkConfig

    config = BenchmarkConfig.load(args.config) if args.config else BenchmarkConfig()
    updates = {k: v for k, v in {
        "definitions": args.definitions, "solutions": args.solutions, "devices": args.devices,
        "seed": args.seed, "max_elements": args.max_elements, "log_dir": args.log_dir}.items() if v is not None}
    if args.module:
        updates["modules"] = list(config.modules) + list(args.module)
    if args.baseline is not None:
        updates["baseline"] = None if args.baseline.lower() == "none" else args.baseline
    for flag, key in ((args.resume, "resume"), (args.isolate, "isolate")):
        if flag:
            updates[key] = True
    if args.no_reference_timing:
        updates["time_reference"] = False
    overrides = dict(config.overrides)
    overrides.update({k: getattr(args, k) for k in SETTING_OPTIONS if getattr(args, k) is not None})
    updates["overrides"] = overrides
    return BenchmarkConfig.model_validate({**config.model_dump(by_alias=True), **updates})


def open_dataset(args: argparse.Namespace):
    """The TraceSet to run and write to (see the module doc)."""
    from ..trace import TraceSet
    from ..trace.builtin import load_builtin_trace_set

    if args.dataset and not Path(args.dataset).exists():
        raise SystemExit(f"opforge run: no dataset at {args.dataset} (a dataset folder or a .json file)")
    target = Path(args.output) if args.output else (None if args.dataset else BUILTIN_OUTPUT)
    if target is not None and not target.exists():
        source = TraceSet.load(args.dataset) if args.dataset else load_builtin_trace_set()
        source.save(target)
    trace_set = TraceSet.load(target if target is not None else args.dataset)
    if getattr(args, "builtin", False):
        from .builtin_offer import add_builtin_solutions

        added = add_builtin_solutions(trace_set, args.definitions)
        print(f"added opforge's built-in solutions: {', '.join(added)}" if added else
              "--builtin: every definition opforge knows here already has its built-in solution", flush=True)
    return trace_set


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..report.console import print_tables
    from . import display
    from .cluster import cli as cluster_cli
    from .runner import Benchmark

    try:
        config = config_from(args)
    except ValueError as exc:
        raise SystemExit(f"opforge run: {exc}") from None
    trace_set = open_dataset(args)
    console = Console()
    where = trace_set.single_file or trace_set.root
    try:
        bench = Benchmark(trace_set, config) if args.ray is None else cluster_cli.benchmark(args, trace_set, config, console)
    except ValueError as exc:
        raise SystemExit(f"opforge run: {exc}") from None
    progress = display.RunProgress(console)
    bench.on_start, bench.on_result = progress.start, progress.finished
    try:
        bench.run_all()
    except ValueError as exc:
        raise SystemExit(f"opforge run: {exc}") from None
    except KeyboardInterrupt:
        progress.stop()
        console.print(f"interrupted: {len(bench.result.traces)} traces recorded in {where}; "
                      + ("every device worker of the cluster was stopped; " if args.ray is not None else "")
                      + "`opforge run --resume` with the same options goes on from there", soft_wrap=True)
        return 130
    finally:
        progress.stop()
    items = progress.items  # in the order they finished
    if not items:
        from .builtin_offer import nothing_to_run

        why, mistake = nothing_to_run(trace_set, args.definitions, args.solutions, config.modules, config.resume)
        console.print(f"opforge run: nothing to run: {why}", soft_wrap=True, highlight=False)
        return 1 if mistake else 0
    print_tables(None, [display.results_table(items)])
    for tail in filter(None, map(display.worker_output, items)):
        console.print(tail, highlight=False, soft_wrap=True)
    failed = [t for t in bench.result.traces if not t.is_successful()]
    suspect = [t for t in bench.result.traces if t.is_successful() and t.evaluation.performance.suspect]
    if args.ray is not None:
        for line in cluster_cli.closing_lines(bench):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print(f"{len(bench.result.traces) - len(failed)} passed, {len(failed)} failed, "
                  f"{len(bench.result.skipped)} skipped, {len(suspect)} suspect timings; seed {bench.seed}; "
                  f"traces in {where}", soft_wrap=True, highlight=False)
    console.print(f"next: {display.next_command(where, BUILTIN_OUTPUT)}", soft_wrap=True, highlight=False)
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="opforge run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))

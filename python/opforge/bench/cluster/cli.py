"""What ``opforge run --ray`` adds to ``opforge run``: the cluster's benchmark, its notes while it
runs, and its closing lines (one per GPU model, then what the cluster lost)."""

from __future__ import annotations

import argparse

#: --ray's help, and its value when given without an address (a Ray instance on this machine).
HELP = ("run on a Ray cluster, one device worker per GPU anywhere in it: ADDRESS 'auto' (the cluster this "
        "machine belongs to), host:port or ray://host:port; without ADDRESS, a Ray instance started on this "
        "machine for the run (pip install 'opforge[ray]')")
START_LOCAL = ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ray", nargs="?", const=START_LOCAL, metavar="ADDRESS", help=HELP)


def benchmark(args: argparse.Namespace, trace_set, config, console):
    """The RayBenchmark of ``opforge run --ray`` (SetupError, a ValueError, for options a
    cluster run cannot take, or without Ray)."""
    from ..device import SetupError
    from .driver import RayBenchmark, RayConfig, require_ray

    devices = set(config.devices or ["cuda"])
    if not devices <= {"cpu", "cuda"} or len(devices) > 1:
        raise SetupError(f"--devices {' '.join(config.devices)}: with --ray every GPU of the cluster is used "
                         "(--devices cuda, the default) or each GPU slot evaluates on its node's CPU (--devices cpu)")
    require_ray()

    def note(text: str) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    return RayBenchmark(trace_set, config, RayConfig(address=args.ray or None, device=devices.pop()), on_note=note)


def closing_lines(bench) -> list[str]:
    """Per GPU model its workers, nodes and copy bandwidths; then the workers lost, the pairs
    retried or given up, and the workers that never started."""
    log = bench.cluster
    lines = []
    for hardware, workers in log.groups.items():
        nodes = {name.split(") ")[0] for name, _ in workers}
        low, high = (f"{g:.0f}" for g in (min(g for _, g in workers), max(g for _, g in workers)))
        span = f"{low} GB/s" if low == high else f"{low}-{high} GB/s"
        lines.append(f"{hardware}: {len(workers)} device worker(s) on {len(nodes)} node(s), copy bandwidth {span}")
    if log.lost:
        lines.append(f"{len(log.lost)} device worker(s) died during the run; {len(log.retried)} pair(s) in flight "
                     f"were retried elsewhere, {len(log.given_up)} lost twice and recorded as RUNTIME_ERROR")
    if log.never_started:
        lines.append(f"{len(log.never_started)} device worker(s) never started: {log.never_started[0]}"
                     + (" ..." if len(log.never_started) > 1 else ""))
    return lines

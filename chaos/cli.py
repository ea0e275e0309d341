"""`python -m chaos run|all|check|plants|nemeses`: one run of chosen workloads under one nemesis
mix, every mix in turn (`make chaos`), a history checked again, and the lists to choose from. A run
ends with a line `N anomalies` and exits 1 when N > 0 (2 when the harness itself failed)."""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

from bench.progress import Progress

DEFAULT_WORKLOADS = "queue,txn,compacted"
ALL_RUN_TIME_S = 60.0  # per mix in `all`: 8 mixes, each with its cluster start, heal and final reads, inside 20 minutes on 2 cores


def _workloads(text: str) -> list[str]:
    from .workloads import WORKLOADS

    names = [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown workload(s) {', '.join(unknown) or '(none)'}; known: {', '.join(WORKLOADS)}")
    return names


def parser() -> argparse.ArgumentParser:
    from .run import DEFAULT_RESULTS

    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--workload", type=_workloads, default=DEFAULT_WORKLOADS, help=f"comma-separated workloads run together (default {DEFAULT_WORKLOADS})")
    common.add_argument("--seed", type=int, default=None, help="the run's random seed (default: a random one, recorded in the report)")
    common.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS, help="where each run's directory is written (default chaos-results/)")
    common.add_argument("--no-netns", action="store_true", help="run on loopback with process faults only, even as root")
    common.add_argument("--scale", type=float, default=1.0, help="client operation rate, relative to the default")
    run = sub.add_parser("run", parents=[common], help="one run: workloads under one nemesis mix")
    run.add_argument("--nemesis", default="all", help="the nemesis mix (python -m chaos nemeses lists them; default all)")
    run.add_argument("--time", type=float, default=60.0, help="seconds of workload under faults, before the heal (default 60)")
    run.add_argument("--plant", default=None, help="turn on a planted bug (python -m chaos plants lists them)")
    every = sub.add_parser("all", parents=[common], help="every nemesis mix in turn, each with the workloads (make chaos)")
    every.add_argument("--time", type=float, default=ALL_RUN_TIME_S, help=f"seconds of faults per mix (default {ALL_RUN_TIME_S:.0f})")
    check = sub.add_parser("check", help="check a history file again and print what it finds")
    check.add_argument("history", type=Path)
    sub.add_parser("plants", help="list the planted bugs")
    sub.add_parser("nemeses", help="list the nemesis mixes")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "plants":
        from .plants import PLANTS

        for plant in PLANTS.values():
            print(f"{plant.name:24} caught as {', '.join(sorted(plant.expect)):32} by {', '.join(plant.workloads):10} {plant.description}")
        return 0
    if args.command == "nemeses":
        from .nemesis import NEMESES

        for name, description in NEMESES.items():
            print(f"{name:14} {description}")
        return 0
    if args.command == "check":
        return _check(args.history)
    if args.command == "run":
        return _runs(args, [args.nemesis], args.plant)
    if args.command == "all":
        from .nemesis import NEMESES

        return _runs(args, [n for n in NEMESES if n != "none"], None)
    raise AssertionError(args.command)


def _check(path: Path) -> int:
    from . import history
    from .checker import check

    result = check(history.read(path), ww_deps=False)  # as a run judges: write cycles are Kafka's own (chaos/run.py)
    for cls, found in sorted(result.anomalies.items()):
        for anomaly in found:
            print(f"{cls}: {anomaly.message} (ops {', '.join(map(str, anomaly.ops[:8]))})")
    print(f"{result.count} anomalies")
    return 1 if result.count else 0


def _runs(args, mixes: list[str], plant: str | None) -> int:
    from .nemesis import NEMESES
    from .plants import PLANTS
    from .run import RunOptions, run

    unknown = [m for m in mixes if m not in NEMESES]
    if unknown:
        print(f"unknown nemesis {', '.join(unknown)}; known: {', '.join(NEMESES)}", file=sys.stderr)
        return 2
    if plant is not None and plant not in PLANTS:
        print(f"unknown plant {plant}; known: {', '.join(PLANTS)}", file=sys.stderr)
        return 2
    netns = False if args.no_netns else None
    began = time.monotonic()
    total, summary = 0, []
    for mix in mixes:
        options = RunOptions(workloads=args.workload, nemesis=mix, time_s=args.time, plant=plant, results_dir=args.results_dir, netns=netns, scale=args.scale)
        if args.seed is not None:
            options.seed = args.seed
        progress = Progress(f"chaos {mix}")
        try:
            outcome = run(options, progress)
        except Exception:
            traceback.print_exc()
            print(f"chaos {mix}: the harness failed (see above); no verdict", file=sys.stderr)
            return 2
        total += outcome.anomalies
        classes = ", ".join(f"{cls} {len(found)}" for cls, found in sorted(outcome.result.anomalies.items()) if found)
        summary.append(f"{mix:14} {outcome.anomalies:5} anomalies{f' ({classes})' if classes else ''}  {outcome.report_path}")
        if plant is not None:
            expected = PLANTS[plant].expect
            caught = sorted(cls for cls, found in outcome.result.anomalies.items() if found and cls in expected)
            summary.append(f"plant {plant}: {'caught as ' + ', '.join(caught) if caught else 'NOT caught as ' + ', '.join(sorted(expected))}")
    if len(mixes) > 1:
        print(f"chaos: {len(mixes)} runs in {time.monotonic() - began:.0f}s")
    for line in summary:
        print(line)
    print(f"{total} anomalies")
    return 1 if total else 0

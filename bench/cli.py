"""`python -m bench <scenario> [options]`: start the system, run the scenario, write
bench/results/<timestamp>-<scenario>/ (result.json, results.md, plots, broker.log), and exit 0
only if every acknowledged record was accounted for. `python -m bench all` runs every scenario."""

from __future__ import annotations

import argparse
import datetime
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

from . import options
from .progress import Progress
from .scenarios import SCENARIOS
from .servers import Servers
from .systems import SYSTEMS

DEFAULT_RESULTS = Path(__file__).resolve().parent / "results"


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("every scenario")
    g.add_argument("--quick", action="store_true", help="a short smoke run (CI): seconds per step instead of ten, and a 4 MiB producer queue (tens of MB/s)")
    g.add_argument("--system", choices=sorted(SYSTEMS), default="neve-dev", help="what to benchmark (default neve-dev)")
    g.add_argument("--duration", type=float, default=None, help="measured seconds per load step (default: the scenario's)")
    g.add_argument("--warmup", type=float, default=None, help="unmeasured seconds before each window (default: the scenario's)")
    g.add_argument("--linger-ms", type=int, default=None, help="broker WAL linger (sets NEVE_WAL_LINGER_MS; broker default 200)")
    g.add_argument("--flush-bytes", type=options.size, default=None, help="broker WAL flush size (sets NEVE_WAL_FLUSH_BYTES; broker default 4MiB)")
    g.add_argument("--broker-env", type=options.key_value, action="append", default=[], metavar="NEVE_X=V", help="extra broker environment (repeatable)")
    g.add_argument("--producer-config", type=options.key_value, action="append", default=[], metavar="K=V", help="librdkafka producer setting (repeatable)")
    g.add_argument(
        "--client",
        choices=["c", "python"],
        default="c",
        help=(
            "what drives librdkafka in the producer processes: c (bench/loadgen/produce.c, built with the C compiler; the default, but the transactions scenario's is python), "
            "or python (confluent-kafka, about 3 more CPU-microseconds per record, taken from the system under test)"
        ),
    )
    g.add_argument("--consumer-config", type=options.key_value, action="append", default=[], metavar="K=V", help="librdkafka consumer setting (repeatable)")
    g.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS, help="where <timestamp>-<scenario>/ is written (default bench/results)")
    g.add_argument("--work-dir", type=Path, default=None, help="parent of the temporary data dir (default: the system temp dir)")
    g.add_argument(
        "--profile",
        nargs="?",
        const="svg",
        choices=["svg", "raw"],
        default=None,
        help="py-spy the neve broker over each window (needs py-spy): svg, a flame graph (default), or raw, collapsed stacks whose hottest frames results.md lists",
    )
    g.add_argument("--keep-data", action="store_true", help="keep the broker's data dir after the run")
    return common


def parser() -> argparse.ArgumentParser:
    common = _common()
    p = argparse.ArgumentParser(prog="python -m bench", description="neve's benchmark suite: starts the system, drives librdkafka load, writes results.")
    sub = p.add_subparsers(dest="scenario", required=True, metavar="scenario")
    for name, module in SCENARIOS.items():
        module.add_arguments(sub.add_parser(name, parents=[common], help=module.HELP, description=module.__doc__))
    sub.add_parser("all", parents=[common], help="every scenario in turn, each with its defaults")
    return p


def _results_dir(parent: Path, scenario: str) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(100):
        path = parent / (f"{stamp}-{scenario}" + (f"-{n}" if n else ""))
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot make a results dir under {parent}")


def run_scenario(args: argparse.Namespace, argv: list[str]) -> bool:
    from . import report
    from .run import Run

    name = args.scenario
    out_dir = _results_dir(args.results_dir, name)
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix=f"neve-bench-{name}-", dir=args.work_dir))
    progress = Progress(name)
    run = Run(name, args, argv, out_dir, work_dir, progress, Servers(work_dir / "servers", out_dir))
    load = run._machine["loadavg_at_start"]
    if load is not None and load > 0.5 * run._machine["nproc"]:
        progress.line(f"WARNING: load average {load} on {run._machine['nproc']} CPUs before we start: other work will skew the figures")
    try:
        SCENARIOS[name].run(run)
    except KeyboardInterrupt:
        run.fail("interrupted")
        raise
    except Exception as e:
        traceback.print_exc()
        run.fail(f"scenario failed: {e!r}")
    finally:
        run.stop_all()
        doc = run.result()
        written = report.write(run, doc)
        if args.keep_data:
            progress.line(f"data kept in {work_dir}")
        else:
            shutil.rmtree(work_dir, ignore_errors=True)
        progress.line(f"wrote {', '.join(p.name for p in written)}")
        print(f"results: {out_dir}", flush=True)
    return doc["ok"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if args.scenario != "all":
        return 0 if run_scenario(args, argv) else 1
    rest = argv[argv.index("all") + 1 :]
    failed = []
    for name in SCENARIOS:
        scenario_argv = [name, *rest]
        if not run_scenario(parser().parse_args(scenario_argv), scenario_argv):
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0

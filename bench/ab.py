"""Before and after: one scenario run for two versions of neve in turn, on the same machine, and
each step's figures side by side.

This 2-core machine's speed drifts by 10-30% within minutes, so a figure measured once before a
change and once after it says more about the drift than about the change. This runs the base
version (A) and the candidate (B) alternately, A B B A B A A B ..., so a steady drift weighs on
both alike, and writes every run's figures with the median of each side.

    python -m bench.ab --base REV [--candidate REV] [--rounds N] -- <scenario> [bench options]

A revision is checked out into a temporary git worktree of this repository (or of --repo);
without --candidate, B is the checkout as it is, uncommitted changes included. Each run is `python -m bench <scenario> ...` in its
own tree (this interpreter, so the same installed dependencies), with its own --results-dir under
this run's folder, which gets ab.json and ab.md beside the runs' own results. Exits 0 only if
every run did.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from .cli import DEFAULT_RESULTS

REPO = Path(__file__).resolve().parent.parent

# (label, how to read it from a step of result.json); a step without the figure leaves it out
MEASURES: list[tuple[str, tuple[str, ...]]] = [
    ("MB/s produced", ("mb_per_s",)),
    ("MB/s consumed", ("consume_mb_per_s",)),
    ("broker CPU-s/GiB produced", ("broker_cpu_s_per_gib_produced",)),
    ("broker CPU-s/GiB consumed", ("broker_cpu_s_per_gib_consumed",)),
    ("ack p50 ms", ("ack_latency_ms", "p50")),
    ("ack p99 ms", ("ack_latency_ms", "p99")),
    ("e2e p99 ms", ("e2e_latency_ms", "p99")),
    ("machine busy cores", ("machine_busy_cores",)),
    # catchup-table has no load steps: each size's case of derived["catchup_table"] is one (below)
    ("Parquet / WAL", ("parquet_over_wal",)),
    ("WAL MB/s", ("wal", "mb_per_s")),
    ("Parquet MB/s", ("parquet", "mb_per_s")),
    ("broker CPU-s/GiB WAL", ("wal", "broker_cpu_s_per_gib")),
    ("broker CPU-s/GiB Parquet", ("parquet", "broker_cpu_s_per_gib")),
    ("S3 GETs/GiB WAL", ("wal", "store_gets_per_gib")),
    ("S3 GETs/GiB Parquet", ("parquet", "store_gets_per_gib")),
    # freshness: one step of its own (below)
    ("freshness p50 s", ("freshness_s", "p50")),
    ("freshness p99 s", ("freshness_s", "p99")),
    ("node cores", ("freshness", "node_cores")),
    ("node CPU-s/GiB", ("freshness", "node_cpu_s_per_gib")),
]


def run_order(rounds: int) -> list[str]:
    """A B, B A, A B, ...: each round runs both sides, the first side alternating."""
    order: list[str] = []
    for n in range(rounds):
        order += ["A", "B"] if n % 2 == 0 else ["B", "A"]
    return order


def _figure(step: dict, path: tuple[str, ...]) -> float | None:
    value: object = step
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _steps(doc: dict) -> list[dict]:
    """A result document's load steps, each catch-up case (catchup-table) as a step named by
    its record size, and freshness's figures as one step."""
    derived = doc.get("derived") or {}
    cases = derived.get("catchup_table") or []
    fresh = [{"name": "freshness", "freshness_s": derived["freshness_s"], "freshness": derived.get("freshness", {})}] if "freshness_s" in derived else []
    return [*doc.get("steps", []), *({"name": f"catch-up {c['record_bytes']} B", **c} for c in cases), *fresh]


def compare(runs_a: list[dict], runs_b: list[dict]) -> list[dict]:
    """One row per step and measure that both sides have: every run's figure, in run order, and
    the median of each side with B's over A's."""
    steps: list[str] = []
    for doc in (*runs_a, *runs_b):
        for step in _steps(doc):
            if step["name"] not in steps:
                steps.append(step["name"])
    rows = []
    for name in steps:
        for label, path in MEASURES:
            sides = []
            for runs in (runs_a, runs_b):
                values = [_figure(s, path) for doc in runs for s in _steps(doc) if s["name"] == name]
                sides.append([v for v in values if v is not None])
            a, b = sides
            if not a or not b:
                continue
            median_a, median_b = statistics.median(a), statistics.median(b)
            rows.append(
                {
                    "step": name,
                    "measure": label,
                    "a": a,
                    "b": b,
                    "median_a": median_a,
                    "median_b": median_b,
                    "b_over_a": round(median_b / median_a, 3) if median_a else None,
                }
            )
    return rows


def _number(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}"


def markdown(rows: list[dict], base: str, candidate: str, command: str, order: list[str]) -> str:
    lines = [
        f"A: {base}; B: {candidate}; runs in the order {' '.join(order)}.",
        "",
        f"    {command}",
        "",
        "| step | measure | A | B | B / A (medians) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = "–" if r["b_over_a"] is None else f"{r['b_over_a']:.3f}"
        a = ", ".join(_number(v) for v in r["a"])
        b = ", ".join(_number(v) for v in r["b"])
        lines.append(f"| {r['step']} | {r['measure']} | {a} | {b} | {ratio} |")
    return "\n".join(lines) + "\n"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


class Trees:
    """The two source trees: a worktree of `repo` per revision given, else `repo` as it is."""

    def __init__(self, repo: Path, parent: Path) -> None:
        self.repo = repo
        self.parent = parent
        self.added: list[Path] = []

    def tree(self, side: str, revision: str | None) -> tuple[Path, str]:
        """(tree, description) of one side."""
        if revision is None:
            head = _git(self.repo, "rev-parse", "--short", "HEAD")
            dirty = _git(self.repo, "status", "--porcelain", "--untracked-files=no")
            return self.repo, f"the working tree (HEAD {head}" + (" with uncommitted changes)" if dirty else ")")
        commit = _git(self.repo, "rev-parse", "--short", "--verify", f"{revision}^{{commit}}")
        path = self.parent / f"tree-{side}"
        _git(self.repo, "worktree", "add", "--detach", str(path), commit)
        self.added.append(path)
        return path, f"{revision} ({commit})" if revision != commit else commit

    def remove(self) -> None:
        for path in self.added:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=self.repo, capture_output=True)
        if self.added:
            subprocess.run(["git", "worktree", "prune"], cwd=self.repo, capture_output=True)
        self.added.clear()


def _say(text: str) -> None:
    print(f"[ab] {text}", file=sys.stderr, flush=True)


def _one_run(tree: Path, bench_args: list[str], results: Path) -> tuple[dict | None, float]:
    """Run the bench in `tree`; (its result document, or None if it wrote none; seconds taken)."""
    env = dict(os.environ, PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.monotonic()
    # its stdout (its results line) goes to stderr with its progress: this one's stdout is the table
    subprocess.run([sys.executable, "-m", "bench", *bench_args, "--results-dir", str(results)], cwd=tree, env=env, stdout=sys.stderr)
    documents = sorted(results.glob("*/result.json"))
    return (json.loads(documents[-1].read_text()) if documents else None), time.monotonic() - started


def _runs(order: list[str], trees: dict[str, Path], bench_args: list[str], out: Path) -> Iterator[tuple[str, dict | None, dict]]:
    """(side, result document or None, what to record of the run) per run, in `order`."""
    for n, side in enumerate(order, 1):
        _say(f"run {n}/{len(order)}: {side}")
        results = out / f"{n:02d}-{side}"
        doc, took = _one_run(trees[side], bench_args, results)
        _say(f"run {n}/{len(order)}: {side} " + ("wrote no result" if doc is None else f"{'ok' if doc['ok'] else 'NOT ok'} in {took:.0f} s"))
        record = {
            "side": side,
            "results": str(results),
            "ok": bool(doc and doc["ok"]),
            "neve_commit": doc["machine"]["neve_commit"] if doc else None,
            "started_at": doc["started_at"] if doc else None,
            "elapsed_s": round(took, 1),
        }
        yield side, doc, record


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0], usage="%(prog)s --base REV [options] -- <scenario> [bench options]")
    p.add_argument("--base", required=True, help="the revision measured as A (a commit, branch or tag)")
    p.add_argument("--candidate", default=None, help="the revision measured as B (default: the working tree as it is)")
    p.add_argument("--repo", type=Path, default=REPO, help="the git repository of both revisions (default: this checkout)")
    p.add_argument("--rounds", type=int, default=2, help="runs of each side (default 2: A B B A)")
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS, help="where <timestamp>-ab-<scenario>/ is written (default bench/results)")
    p.add_argument("bench", nargs=argparse.REMAINDER, help="after --: the scenario and its options, as for python -m bench")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    bench_args = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    if not bench_args or bench_args[0].startswith("-") or bench_args[0] == "all":
        parser().error("give one scenario and its options after --, e.g. -- partitions --counts 10000")
    if "--results-dir" in bench_args or any(a.startswith("--results-dir=") for a in bench_args):
        parser().error("--results-dir belongs before --: each run gets a folder of its own under it")
    if args.rounds < 1:
        parser().error("--rounds must be at least 1")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.results_dir / f"{stamp}-ab-{bench_args[0]}"
    out.mkdir(parents=True)
    command = "python -m bench " + " ".join(bench_args)
    order = run_order(args.rounds)
    trees = Trees(args.repo.resolve(), Path(tempfile.mkdtemp(prefix="neve-ab-")))
    try:
        tree_a, base = trees.tree("a", args.base)
        tree_b, candidate = trees.tree("b", args.candidate)
        _say(f"A: {base}; B: {candidate}; {len(order)} runs of: {command}")
        documents: dict[str, list[dict]] = {"A": [], "B": []}
        runs = []
        for side, doc, record in _runs(order, {"A": tree_a, "B": tree_b}, bench_args, out):
            runs.append(record)
            if doc is not None:
                documents[side].append(doc)
    finally:
        trees.remove()
        shutil.rmtree(trees.parent, ignore_errors=True)
    rows = compare(documents["A"], documents["B"])
    failed = sum(not r["ok"] for r in runs)
    summary = {"base": base, "candidate": candidate, "command": command, "order": order, "runs": runs, "failed_runs": failed, "rows": rows}
    (out / "ab.json").write_text(json.dumps(summary, indent=1) + "\n")
    table = markdown(rows, base, candidate, command, order)
    (out / "ab.md").write_text(table)
    print(table)
    print(f"results: {out}", flush=True)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

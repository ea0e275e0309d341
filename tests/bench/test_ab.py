"""bench/ab.py: the run order, the side-by-side table, and one real A/B run of two commits of a
throwaway clone whose broker prints something different, so each side is seen running its own
tree's code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.ab import compare, markdown, run_order

REPO = Path(__file__).resolve().parents[2]


def step(name: str, mb: float, cpu: float | None, p99: float) -> dict:
    return {"name": name, "mb_per_s": mb, "broker_cpu_s_per_gib_produced": cpu, "ack_latency_ms": {"p50": p99 / 2, "p99": p99}, "e2e_latency_ms": None}


def test_each_round_runs_both_sides_and_the_first_side_alternates():
    assert run_order(1) == ["A", "B"]
    assert run_order(2) == ["A", "B", "B", "A"]
    assert run_order(3) == ["A", "B", "B", "A", "A", "B"]


def test_compare_lists_every_run_in_order_with_the_medians_and_their_ratio():
    runs_a = [{"steps": [step("p10", 100.0, 2.0, 200.0), step("p10000", 16.0, 18.0, 3000.0)]}, {"steps": [step("p10", 110.0, 2.2, 220.0), step("p10000", 17.0, 17.0, 3100.0)]}]
    runs_b = [{"steps": [step("p10", 120.0, 1.5, 180.0), step("p10000", 18.0, 15.0, 2900.0)]}, {"steps": [step("p10", 130.0, None, 190.0)]}]
    rows = compare(runs_a, runs_b)
    by = {(r["step"], r["measure"]): r for r in rows}
    assert [r["step"] for r in rows] == ["p10"] * 4 + ["p10000"] * 4
    mb = by[("p10", "MB/s produced")]
    assert (mb["a"], mb["b"], mb["median_a"], mb["median_b"], mb["b_over_a"]) == ([100.0, 110.0], [120.0, 130.0], 105.0, 125.0, 1.19)
    cpu = by[("p10", "broker CPU-s/GiB produced")]
    assert (cpu["a"], cpu["b"], cpu["b_over_a"]) == ([2.0, 2.2], [1.5], 0.714)  # a run without the figure is left out
    assert by[("p10000", "MB/s produced")]["b"] == [18.0]  # B's second run had no such step
    assert by[("p10000", "ack p99 ms")]["b_over_a"] == round(2900 / 3050, 3)
    assert not any(r["measure"] in ("e2e p99 ms", "MB/s consumed") for r in rows)  # neither side has them
    table = markdown(rows, "main (abc1234)", "the working tree (HEAD abc1234)", "python -m bench partitions", run_order(2))
    assert "| p10 | MB/s produced | 100.0, 110.0 | 120.0, 130.0 | 1.190 |" in table.splitlines()
    assert "| p10000 | broker CPU-s/GiB produced | 18.0, 17.0 | 15.0 | 0.857 |" in table.splitlines()
    assert table.startswith("A: main (abc1234); B: the working tree (HEAD abc1234); runs in the order A B B A.")


def catchup_case(size: int, wal: float, parquet: float, cpu_wal: float, cpu_parquet: float) -> dict:
    """One size's case of catchup-table's derived figures (neve-dev: no GET counts)."""
    read = {"mb_per_s": None, "broker_cpu_s_per_gib": None, "store_gets_per_gib": None}
    return {
        "record_bytes": size,
        "wal": {**read, "mb_per_s": wal, "broker_cpu_s_per_gib": cpu_wal},
        "parquet": {**read, "mb_per_s": parquet, "broker_cpu_s_per_gib": cpu_parquet},
        "parquet_over_wal": round(parquet / wal, 3),
    }


def test_compare_reads_the_catchup_figures_of_each_size():
    """catchup-table's result has no load steps: each size's case is compared as a step."""
    runs_a = [{"steps": [], "derived": {"catchup_table": [catchup_case(1024, 400.0, 200.0, 1.6, 5.0), catchup_case(100, 100.0, 80.0, 1.9, 7.0)]}}]
    runs_b = [{"steps": [], "derived": {"catchup_table": [catchup_case(1024, 400.0, 300.0, 1.6, 4.0), catchup_case(100, 100.0, 90.0, 1.9, 6.0)]}}]
    rows = compare(runs_a, runs_b)
    assert [r["step"] for r in rows] == ["catch-up 1024 B"] * 5 + ["catch-up 100 B"] * 5
    by = {(r["step"], r["measure"]): (r["a"], r["b"], r["b_over_a"]) for r in rows}
    assert by[("catch-up 1024 B", "Parquet / WAL")] == ([0.5], [0.75], 1.5)
    assert by[("catch-up 1024 B", "Parquet MB/s")] == ([200.0], [300.0], 1.5)
    assert by[("catch-up 100 B", "WAL MB/s")] == ([100.0], [100.0], 1.0)
    assert by[("catch-up 100 B", "broker CPU-s/GiB WAL")] == ([1.9], [1.9], 1.0)
    assert by[("catch-up 100 B", "broker CPU-s/GiB Parquet")] == ([7.0], [6.0], 0.857)
    assert not any("GETs" in measure for _, measure in by)  # not counted on local files


def test_compare_reads_the_freshness_figures():
    """freshness's result has no load steps: its percentiles and the node's CPU are one step."""

    def run(p50: float, p99: float, cores: float, per_gib: float) -> dict:
        return {"steps": [], "derived": {"freshness_s": {"count": 10, "p50": p50, "p99": p99}, "freshness": {"node_cores": cores, "node_cpu_s_per_gib": per_gib}}}

    rows = compare([run(2.0, 4.0, 0.4, 200.0), run(2.2, 4.4, 0.36, 190.0)], [run(1.5, 2.8, 0.26, 140.0)])
    by = {r["measure"]: (r["a"], r["b"], r["b_over_a"]) for r in rows}
    assert {r["step"] for r in rows} == {"freshness"}
    assert by["freshness p50 s"] == ([2.0, 2.2], [1.5], 0.714)
    assert by["freshness p99 s"] == ([4.0, 4.4], [2.8], 0.667)
    assert by["node cores"] == ([0.4, 0.36], [0.26], 0.684)
    assert by["node CPU-s/GiB"] == ([200.0, 190.0], [140.0], 0.718)


def _git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com")
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True, env=env).stdout.strip()


@pytest.mark.integration
def test_ab_runs_each_side_from_its_own_tree_and_removes_the_worktrees(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    cli = clone / "neve" / "cli.py"
    assert cli.read_text().count("; data in {node.data_dir}") == 1  # the bench waits for what comes before
    cli.write_text(cli.read_text().replace("; data in {node.data_dir}", "; data (candidate) in {node.data_dir}"))
    _git(clone, "commit", "--quiet", "-am", "candidate: another startup line")
    base = _git(clone, "rev-parse", "--short", "HEAD~1")
    candidate = _git(clone, "rev-parse", "--short", "HEAD")
    results = tmp_path / "results"

    proc = subprocess.run(
        [sys.executable, "-m", "bench.ab", "--repo", str(clone), "--base", "HEAD~1", "--candidate", "HEAD", "--rounds", "1", "--results-dir", str(results),
         "--", "partitions", "--quick", "--system", "neve-dev", "--counts", "10", "--duration", "1", "--warmup", "0.5", "--work-dir", str(tmp_path / "work")],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    out = Path(next(line.split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("results: ")))
    summary = json.loads((out / "ab.json").read_text())
    assert summary["order"] == ["A", "B"] and summary["failed_runs"] == 0
    assert [(r["side"], r["neve_commit"], r["ok"]) for r in summary["runs"]] == [("A", base, True), ("B", candidate, True)]
    for run in summary["runs"]:
        (log,) = Path(run["results"]).glob("*/broker.log")
        assert ("; data (candidate) in " in log.read_text()) is (run["side"] == "B")
    mb = next(r for r in summary["rows"] if (r["step"], r["measure"]) == ("p10", "MB/s produced"))
    assert len(mb["a"]) == 1 and len(mb["b"]) == 1 and mb["a"][0] > 0 and mb["b"][0] > 0
    assert (out / "ab.md").read_text().startswith(f"A: HEAD~1 ({base}); B: HEAD ({candidate}); runs in the order A B.")
    assert _git(clone, "worktree", "list", "--porcelain").count("worktree ") == 1  # only the clone itself


def test_ab_refuses_a_results_dir_among_the_scenario_options(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench.ab", "--base", "HEAD", "--", "produce", "--results-dir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "--results-dir belongs before --" in proc.stderr
    assert not any(tmp_path.iterdir())

"""The harness end to end, as `python -m chaos` runs it: a short smoke run on the real cluster finds
nothing (in `make test`), and every planted bug is found by a run of at most three minutes, as the
class it should be (`make test-slow`, marker `plants`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.plants import PLANTS

ROOT = Path(__file__).resolve().parents[2]
SMOKE_TIME_S = 30
PLANT_TIME_S = 45


def chaos(artifacts_dir: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "chaos", *args, "--results-dir", str(artifacts_dir / "runs")],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    (artifacts_dir / "chaos.out").write_text(done.stdout + "\n--- stderr\n" + done.stderr)
    return done


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_a_smoke_run_of_every_workload_under_process_faults_finds_no_anomaly(artifacts_dir):
    done = chaos(artifacts_dir, "run", "--workload", "queue,txn,compacted", "--nemesis", "kill", "--time", str(SMOKE_TIME_S), "--seed", "41", timeout=840)
    lines = done.stdout.strip().splitlines()
    assert lines and lines[-1] == "0 anomalies", f"exit {done.returncode}; {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0
    reports = list((artifacts_dir / "runs").glob("*/report.md"))
    assert len(reports) == 1 and "**0 anomalies**" in reports[0].read_text()


@pytest.mark.plants
@pytest.mark.integration
@pytest.mark.timeout(900)
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_planted_bug_is_caught_as_its_class(artifacts_dir, plant):
    spec = PLANTS[plant]
    done = chaos(artifacts_dir, "run", "--workload", ",".join(spec.workloads), "--nemesis", "none", "--time", str(PLANT_TIME_S), "--plant", plant, "--seed", "42", timeout=840)
    assert done.returncode == 1, f"exit {done.returncode}; {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert f"plant {plant}: caught as " in done.stdout, done.stdout[-3000:]

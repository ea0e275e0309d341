"""A workload's clients in a process of their own, and the harness's handle on it. librdkafka can
crash the process it runs in (a run saw a segfault in its main thread right after a broker came
back); the harness, which must heal the cluster and judge the run, lives elsewhere. A worker
records into a history file of its own on the run's clock, its process numbers and values from a
range of its own, so the files merge into one history (`merge`); a worker that dies is started
again on a new range, and the ops it left open are what Jepsen calls crashed: info.

    python -m chaos.workloads.worker --workload W --mode run|final ... (see `WorkerProcess`)
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import random
import signal
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from chaos import history

ID_RANGE = 10_000_000  # process numbers and values of one worker start: ids of two never meet
STOP_WAIT_S = 90.0  # a worker's stop() joins its clients for up to 60 s (clients.STOP_JOIN_S)


@dataclass
class WorkerProcess:
    """One workload's worker: `start("run")` runs its clients until `stop()`; `start("final")`
    makes its final reads and exits. Each start takes a fresh id range (`generation`)."""

    workload: str
    index: int  # of the workload in the run: its id ranges
    run_id: str
    seed: int
    scale: float
    bootstrap: str
    out_dir: Path
    clock_start: float
    generation: int = 0
    process: subprocess.Popen | None = None
    files: list[Path] = field(default_factory=list)

    def start(self, mode: str, timeout: float = 0.0) -> None:
        self.generation += 1
        path = self.out_dir / f"history-{self.workload}-{self.generation}.jsonl"
        self.files.append(path)
        id_base = (self.index * 1000 + self.generation) * ID_RANGE
        args = [sys.executable, "-m", "chaos.workloads.worker", "--workload", self.workload, "--mode", mode, "--run-id", self.run_id,
                "--seed", str(self.seed + self.generation), "--scale", str(self.scale), "--bootstrap", self.bootstrap, "--history", str(path),
                "--clock-start", repr(self.clock_start), "--id-base", str(id_base), "--timeout", str(timeout)]  # fmt: skip
        with open(self.out_dir / f"worker-{self.workload}.log", "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2])

    def crashed(self) -> int | None:
        """The exit code if the worker ended by itself (it runs until stopped), else None."""
        return None if self.process is None else self.process.poll()

    def stop(self) -> int | None:
        """Ask the worker to stop its clients (SIGTERM), wait; kill it if it does not end."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.wait(STOP_WAIT_S)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            return self.process.returncode


def merge(paths: list[Path], into: Path) -> list[history.Op]:
    """The ops of several history files (one clock) as one history, ordered by time (a file's own
    order kept for equal times), indexes renumbered; written to `into`."""
    tagged = []
    for n, path in enumerate(paths):
        if path.exists():
            tagged += [(op["time"], n, i, op) for i, op in enumerate(history.read(path))]
    tagged.sort(key=lambda t: t[:3])
    ops = [{**op, "index": i} for i, (_, _, _, op) in enumerate(tagged)]
    history.write(into, ops)
    return ops


def count(paths: list[Path], offsets: dict[Path, int], counts: dict[tuple[str, str], int]) -> None:
    """Add the ops written to `paths` since `offsets` to `counts` ((f, type) -> n): progress lines."""
    for path in paths:
        if not path.exists():
            continue
        with open(path, "rb") as f:
            f.seek(offsets.get(path, 0))
            data = f.read()
        whole = data[: data.rfind(b"\n") + 1]
        offsets[path] = offsets.get(path, 0) + len(whole)
        for line in whole.splitlines():
            try:
                op = json.loads(line)
            except json.JSONDecodeError:
                continue
            counts[(op["f"], op["type"])] = counts.get((op["f"], op["type"]), 0) + 1


def main(argv: list[str] | None = None) -> int:
    from . import WORKLOADS

    p = argparse.ArgumentParser(prog="python -m chaos.workloads.worker")
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    p.add_argument("--mode", required=True, choices=["run", "final"])
    p.add_argument("--run-id", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--history", type=Path, required=True)
    p.add_argument("--clock-start", type=float, required=True)
    p.add_argument("--id-base", type=int, required=True)
    p.add_argument("--timeout", type=float, default=0.0, help="final mode: seconds for the final reads")
    args = p.parse_args(argv)
    faulthandler.enable(all_threads=True)  # a crash in librdkafka leaves every thread's Python stack in the worker's log
    recorder = history.Recorder(args.history, start=args.clock_start, id_base=args.id_base)
    workload = WORKLOADS[args.workload](args.run_id, random.Random(args.seed), recorder, scale=args.scale)
    code = 1
    try:
        if args.mode == "final":
            workload.final_reads(args.bootstrap, args.timeout)
        else:
            stopping = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stopping.set())
            workload.setup(args.bootstrap)  # the topics exist after the first worker: "already exists" is done
            workload.start(args.bootstrap)
            stopping.wait()
            workload.stop()
        code = 0
    except BaseException:  # os._exit below would swallow it: the worker's log keeps what ended it
        traceback.print_exc()
    finally:
        recorder.close()
        sys.stdout.flush()
        sys.stderr.flush()
        # an abandoned client's librdkafka threads (a close that never returned) must not hold the process open
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main())

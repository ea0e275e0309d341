"""What the benchmark reads from the operating system: a process's CPU seconds from /proc, and a
description of the machine a run happened on (recorded with every result)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of `pid` (all its threads), in seconds; None once the process is gone.

    Read from /proc/<pid>/stat rather than getrusage because the broker is another process that
    we have not reaped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / _TICKS


def tree_cpu_seconds(root: int) -> float | None:
    """CPU seconds of `root` and every process below it (a Spark driver's JVM and Python workers),
    each counting its reaped children too (cutime, cstime), so a worker that exited inside a
    window still counts; None once `root` is gone. Differences over a window are what was spent."""
    tree = tree_processes(root)
    return sum(cpu for _, cpu in tree.values()) if tree is not None else None


def tree_processes(root: int) -> dict[int, tuple[str, float]] | None:
    """`root` and every process below it: pid -> (command name, CPU seconds with its reaped
    children's), from one reading of /proc (parent links, not the unreliable children files);
    None once `root` is gone."""
    parents: dict[int, int] = {}
    found: dict[int, tuple[str, float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read().decode()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        pid = int(name)
        parents[pid] = int(fields[1])
        found[pid] = (raw[raw.index("(") + 1 : raw.rindex(")")], sum(int(x) for x in fields[11:15]) / _TICKS)  # utime, stime, cutime, cstime
    if root not in found:
        return None
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        tree[pid] = found[pid]
        todo.extend(children.get(pid, ()))
    return tree


def cpu_delta(before: dict[str, float | None], after: dict[str, float | None]) -> dict[str, float]:
    """CPU-seconds each process used between two readings by name (those read both times)."""
    return {name: round(cpu - before[name], 3) for name, cpu in after.items() if cpu is not None and before.get(name) is not None}


def machine_busy_seconds() -> float:
    """CPU-seconds all CPUs of the machine spent busy (not idle, not waiting for I/O) since boot,
    from /proc/stat; the difference over a window, divided by its length, is busy cores."""
    with open("/proc/stat", "rb") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    guest = sum(fields[8:10])  # guest time is already counted in user and nice
    return (sum(fields) - idle - guest) / _TICKS


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _git_commit(repo: Path) -> str | None:
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "")


def _version(v) -> str:
    return v[0] if isinstance(v, tuple) else str(v)  # confluent-kafka returns (str, int) or str


def machine() -> dict:
    import confluent_kafka

    repo = Path(__file__).resolve().parent.parent
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "confluent_kafka": _version(confluent_kafka.version()),
        "librdkafka": confluent_kafka.libversion()[0],
        "neve_commit": _git_commit(repo),
        "loadavg_at_start": load_average(),
    }


def load_average() -> float | None:
    """1-minute load average: other work on the machine skews every figure, so it is recorded."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None

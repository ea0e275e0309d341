"""bench/procstat.py: a process tree's CPU, by process and in total, one reading of /proc; a child
that exits and is reaped still counts (in its parent's cutime)."""

from __future__ import annotations

import os
import subprocess
import sys

from bench import procstat

# Burns at least 0.3 CPU-seconds, says so, and exits once its stdin closes.
_CHILD = "import sys, time\nwhile time.process_time() < 0.3:\n    pass\nprint('burnt', flush=True)\nsys.stdin.read()\n"


def test_a_childs_cpu_counts_while_it_runs_and_once_it_is_reaped():
    me = os.getpid()
    before = procstat.tree_cpu_seconds(me)
    with subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout.readline() == "burnt\n"
            tree = procstat.tree_processes(me)
            assert tree is not None and set(tree) >= {me, child.pid}
            name, cpu = tree[child.pid]
            assert name.startswith("python") and cpu >= 0.2  # /proc counts in ticks (10 ms)
            assert procstat.tree_cpu_seconds(me) >= sum(c for _, c in tree.values()) >= before + 0.2  # a later reading, no less
        finally:
            child.stdin.close()
            child.wait(timeout=60)
    after = procstat.tree_processes(me)
    assert child.pid not in after
    assert procstat.tree_cpu_seconds(me) - before >= 0.2  # the reaped child in this process's cutime
    assert procstat.tree_processes(2**22 + 1) is None  # no such process

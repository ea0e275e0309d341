"""compactor/spark_daemon.py: the daemon Spark starts the compactor's Python workers from has the
tasks' modules imported and glibc's allocator set before it forks them."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
from compactor import spark_daemon
print("compactor.job" in sys.modules, spark_daemon.tune_allocator())
"""


def test_the_daemon_imports_the_tasks_modules_and_tunes_glibc():
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.split() == ["True", "True"]  # glibc (Debian's, the project's images)

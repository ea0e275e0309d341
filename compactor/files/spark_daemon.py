"""pyspark's daemon for the compactor's Python workers (`spark.python.daemon.module`, set by
spark.py): the tasks' modules are imported here once, before the daemon forks a worker per task
slot, so that every worker starts with them. Without it each new worker imported pyarrow,
pyiceberg, pandas and the compactor itself on its first task: a CPU-second or more per worker,
again whenever Spark stopped an idle one.

Spark puts its own copies of pyspark and py4j, as zip files, first on the workers' PYTHONPATH,
and its spark-core jar after them. Where the same packages are installed (pip's pyspark, the
compactor's extra), these are dropped from sys.path before pyspark is imported: a worker calls
importlib.invalidate_caches() at the start of every task, and on Python 3.11 that re-reads the
whole directory of every zip a module was looked for in (the jar's alone: 120 ms of CPU a task,
most of a small task's cost)."""

import gc
import os
import sys
from importlib.machinery import PathFinder


def drop_redundant_zips(path: list[str]) -> list[str]:
    """`path` without Spark's zips of pyspark and py4j, and its jars, when pyspark and py4j import
    from the rest of it; else as it is."""
    rest = [p for p in path if not (p.endswith(".jar") or (p.endswith(".zip") and os.path.basename(p).startswith(("pyspark", "py4j"))))]
    if len(rest) == len(path):
        return path
    found = all(PathFinder.find_spec(name, rest) is not None for name in ("pyspark", "py4j"))
    return rest if found else path


if __name__ == "__main__":
    kept = drop_redundant_zips(sys.path)
    for dropped in set(sys.path) - set(kept):  # finding this module made their zipimporters
        sys.path_importer_cache.pop(dropped, None)
    sys.path[:] = kept

    from pyspark import daemon

    import compactor.files.job  # noqa: F401  (imported for the workers the daemon forks)

    # A reused worker runs gc.collect() after every task: over all of the modules above, 60-70 ms
    # of CPU a task. Frozen, what the workers inherit is not traversed again (and its pages
    # stay shared with the daemon, not copied on a collection's write).
    gc.collect()
    gc.freeze()
    daemon.manager()

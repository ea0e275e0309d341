"""pyspark's daemon for the compactor's Python workers (`spark.python.daemon.module`, set by
spark.py): the tasks' modules are imported here once, before the daemon forks a worker per task
slot, so that every worker starts with them. Without it each new worker imported pyarrow,
pyiceberg, pandas and the compactor itself on its first task: a CPU-second or more per worker,
again whenever Spark stopped an idle one.

The workers' allocator is set here too (glibc's, which they inherit): a task's buffers and
arrays are megabytes each, above glibc's mmap threshold, so each was mapped fresh and its pages
zeroed by the kernel, then unmapped (a task of 100-byte raw values: 0.12 of 0.30 CPU-s was
system time; 0.03 with these settings).
Served from the heap instead, the memory is reused; a worker keeps up to TRIM_BYTES it freed."""

import ctypes
import ctypes.util

from pyspark import daemon

import compactor.job  # noqa: F401  (imported for the workers the daemon forks)

# glibc's mallopt parameters (malloc.h). Blocks up to MMAP_BYTES come from the heap: a task's
# largest (its WAL reads, a batch's records joined) are tens of MiB.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_BYTES = 64 << 20
TRIM_BYTES = 256 << 20


def tune_allocator() -> bool:
    """Raise glibc's mmap and trim thresholds for this process and its forks; False where the C
    library is not glibc (or refuses)."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES))


if __name__ == "__main__":
    tune_allocator()
    daemon.manager()

"""pyspark's daemon for the compactor's Python workers (`spark.python.daemon.module`, set by
spark.py): the tasks' modules are imported here once, before the daemon forks a worker per task
slot, so that every worker starts with them. Without it each new worker imported pyarrow,
pyiceberg, pandas and the compactor itself on its first task: a CPU-second or more per worker,
again whenever Spark stopped an idle one."""

from pyspark import daemon

import compactor.job  # noqa: F401  (imported for the workers the daemon forks)

if __name__ == "__main__":
    daemon.manager()

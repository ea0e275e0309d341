"""The fault harness: Jepsen's method, run inside the project against the real cluster.

A run starts the cluster (chaos/cluster.py: 3 `neve broker`, a 3-member etcd, SeaweedFS, PostgreSQL
and 2 `neve compactor`, each in a network namespace of its own when run as root), drives real Kafka
clients through workloads (chaos/workloads/; each workload's clients in a worker process of their
own, so that a client library's crash costs a restart, not the run) that record every operation
in a history (chaos/history.py), while a nemesis (chaos/nemesis/) kills, pauses, partitions and slows the
processes on a schedule it records too; then it heals, reads every partition and every table back,
and the checker (chaos/checker/, which imports nothing of neve's) names every anomaly the history
shows. chaos/report.py writes what a person reads; chaos/plants.py lists the deliberate bugs a run
can turn on to prove that the checker catches them.

    python -m chaos run --workload txn --nemesis pause --time 60
    python -m chaos plants
"""

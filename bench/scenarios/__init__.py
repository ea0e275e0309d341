"""The scenarios, one module each. A scenario module has NAME, HELP, `add_arguments(parser)` for
its own options and `run(run)`, which drives load through `run.load(...)`, measures baselines
with `run.ceiling(...)` and judges the issue-5 targets with `run.target(...)`."""

from __future__ import annotations

from . import (
    catchup,
    catchup_table,
    compaction,
    cost,
    e2e,
    fanout,
    freshness,
    maintenance,
    partitions,
    produce,
    put_ceiling,
    security,
    stored_bytes,
    transactions,
    upsert,
    zones,
)

SCENARIOS = {m.NAME: m for m in (produce, e2e, fanout, catchup, partitions, cost, put_ceiling, compaction, freshness, catchup_table, stored_bytes, maintenance, zones, transactions, upsert, security)}

"""The scenarios, one module each. A scenario module has NAME, HELP, `add_arguments(parser)` for
its own options and `run(run)`, which drives load through `run.load(...)`, measures baselines
with `run.ceiling(...)` and judges the issue-5 targets with `run.target(...)`."""

from __future__ import annotations

from . import (
    catchup,
    compaction,
    cost,
    e2e,
    fanout,
    freshness,
    partitions,
    produce,
    put_ceiling,
)

SCENARIOS = {m.NAME: m for m in (produce, e2e, fanout, catchup, partitions, cost, put_ceiling, compaction, freshness)}

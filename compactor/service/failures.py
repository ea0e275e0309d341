"""A topic whose cycles keep failing is reported: each failure logged (its traceback the first time
for each kind), counted, and once FAILING_AFTER in a row, `neve_compactor_topic_failing` by reason;
cleared when a cycle of the topic goes through again."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from metadata.model import TopicInfo
from metadata.store import MetadataError

from .. import metrics

log = logging.getLogger("neve.compactor")

FAILING_AFTER = 3  # cycles of a topic failing in a row before it is reported as failing


@dataclass(slots=True)
class Failing:
    """A topic's cycles failing in a row, and the kind of the last failure."""

    reason: str
    count: int = 0
    reasons: set[str] = field(default_factory=set)  # kinds logged with their traceback already


class Failures:
    def __init__(self) -> None:
        self.failed: list[str] = []  # topics whose compaction failed in the last run
        self.now: set[str] = set()  # topics whose cycle failed in this run
        self._failing: dict[str, Failing] = {}  # by topic name

    def new_run(self) -> None:
        self.failed = []
        self.now = set()

    def topic_failed(self, info: TopicInfo, e: Exception) -> None:
        """A topic's cycle failed: counted, logged (its traceback the first time for each kind of
        failure), and once FAILING_AFTER in a row, reported by the gauge."""
        reason = type(e).__name__
        self.now.add(info.name)
        failing = self._failing.setdefault(info.name, Failing(reason))
        if failing.reason != reason:
            metrics.TOPIC_FAILING.labels(info.name, failing.reason).set(0)
            failing.reason = reason
        failing.count += 1
        if not isinstance(e, MetadataError):  # the metadata store away is no failure of the topic's
            metrics.CYCLE_FAILURES.inc()
            self.failed.append(info.name)
        first = reason not in failing.reasons and not isinstance(e, MetadataError)
        failing.reasons.add(reason)
        extra = {"topic": info.name, "reason": reason, "error": str(e), "failures": failing.count}
        log.log(logging.ERROR if failing.count >= FAILING_AFTER else logging.WARNING, "topic's compaction failed; it is retried next cycle", extra=extra, exc_info=e if first else None)
        if failing.count >= FAILING_AFTER:
            metrics.TOPIC_FAILING.labels(info.name, reason).set(failing.count)

    def topic_recovered(self, info: TopicInfo) -> None:
        failing = self._failing.pop(info.name, None)
        if failing is not None:
            metrics.TOPIC_FAILING.labels(info.name, failing.reason).set(0)
            log.info("topic's compaction recovered", extra={"topic": info.name, "failures": failing.count})

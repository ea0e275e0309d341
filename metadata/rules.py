"""The Kafka rules both metadata backends apply, each once (as `sequencer.py` is for offsets):
producer epoch bumps, topic changes, log start moves. Pure: the backends read and write."""

from __future__ import annotations

from collections.abc import Mapping

from .model import TopicInfo
from .store import InvalidPartitions

MAX_EPOCH = 32767  # producer epochs are int16; past it a producer gets a fresh id


def bumped_epoch(producer_id: int, producer_epoch: int) -> int | None:
    """KIP-360: the epoch a producer giving its (id, epoch) moves to, if the backend finds that
    epoch current; None when it gets a fresh id at epoch 0 instead (no id or epoch given, or the
    epoch exhausted), as Kafka does for producers without a transactional id."""
    if producer_id >= 0 and 0 <= producer_epoch < MAX_EPOCH:
        return producer_epoch + 1
    return None


def partition_count(topic: TopicInfo, requested: int | None) -> int:
    """A topic's partition count after an update: unchanged if none is asked for; it only grows."""
    count = topic.partitions if requested is None else requested
    if count < topic.partitions:
        raise InvalidPartitions(f"topic {topic.name} has {topic.partitions} partitions; it cannot shrink to {count}")
    return count


def merged_configs(configs: Mapping[str, str], changes: Mapping[str, str | None] | None) -> dict[str, str]:
    """A topic's configs after an update: the changes over the configs, a None deleting its key."""
    return {k: v for k, v in {**configs, **(changes or {})}.items() if v is not None}


def clamped_log_start(requested: int, log_start: int, high_watermark: int) -> int:
    """Where a partition's log start moves when asked to `requested`: never backwards, never past
    the high watermark."""
    return min(max(requested, log_start), high_watermark)

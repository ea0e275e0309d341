"""The freshness benchmark's many-topic parts that need no server: which topics the reader follows,
where and when each record goes, and a followed partition's current lag."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest

from bench import many_topics
from bench.scenarios import freshness


def test_sample_spreads_evenly_and_takes_every_topic_when_few():
    assert many_topics.sample(1000, 20) == list(range(25, 1000, 50))
    assert many_topics.sample(100, 20) == list(range(2, 100, 5))
    assert many_topics.sample(3, 20) == [0, 1, 2]
    assert many_topics.sample(20, 20) == list(range(20))
    for topics in (21, 39, 999):  # uneven stretches: still k distinct topics, in order
        picked = many_topics.sample(topics, 20)
        assert len(set(picked)) == 20 and picked == sorted(picked) and picked[0] >= 0 and picked[-1] < topics
    with pytest.raises(ValueError):
        many_topics.sample(10, 0)


def test_each_topic_and_partition_gets_its_share_evenly_spaced():
    topics, partitions = 7, 3
    order = [many_topics.target(i, topics, partitions) for i in range(topics * partitions * 4)]
    assert Counter(order) == {(t, p): 4 for t in range(topics) for p in range(partitions)}
    # a topic's records are `topics` apart, so at any rate each topic receives rate/topics a second
    for t in range(topics):
        positions = [i for i, (topic, _) in enumerate(order) if topic == t]
        assert {b - a for a, b in zip(positions, positions[1:], strict=False)} == {topics}
    assert order[:8] == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0), (0, 1)]


def test_pacing_spreads_the_rate():
    assert [many_topics.due(i, 1000.0) for i in (0, 1, 999, 1000)] == [0.0, 0.001, 0.999, 1.0]
    assert many_topics.due(3, 0.5) == 6.0


def test_rate_per_topic_or_in_mb():
    def args(**kw):
        base = {"records_per_topic_s": None, "rate_mb": None, "topics": 1000, "record_bytes": 100}
        return argparse.Namespace(**{**base, **kw})

    assert freshness.rate_of(args(records_per_topic_s=1.0)) == 1000.0
    assert freshness.rate_of(args(rate_mb=10.0)) == 100_000.0  # 10 MB/s of 100 B values, over every topic
    assert freshness.rate_of(args(topics=1, record_bytes=1000)) == 2000.0  # the default 2 MB/s


def test_current_lag_is_the_age_of_the_oldest_unseen_record():
    acks = many_topics.Acks(slots=3)
    for offset, at in enumerate([10.0, 11.0, 12.0]):
        acks.add(0, offset, at)
    acks.add(1, 0, 10.5)
    # slot 0 has seen offset 0: its oldest unseen was acknowledged at 11; slot 1 has caught up;
    # slot 2 has nothing acknowledged
    assert many_topics.current_lags(acks, [0, 0, -1], now=15.0) == [4.0, 0.0, 0.0]
    assert many_topics.current_lags(acks, [-1, -1, -1], now=15.0) == [5.0, 4.5, 0.0]
    assert acks.oldest_unseen(0, 2) is None


def test_window_and_lags_by_slot():
    acks = many_topics.Acks(slots=2)
    acks.add(0, 0, 1.0)
    acks.add(0, 1, 2.0)
    acks.add(1, 0, 2.5)
    acks.add(1, 1, 9.0)
    window = freshness._window(acks, 2.0, 9.0)
    assert window.tolist() == [[0.0, 1.0, 2.0], [1.0, 0.0, 2.5]]
    # slot 1 offset 0 is seen twice (a later poll of the same snapshot): the first sighting counts
    seen = {"slot": [0, 1, 1, 0], "offset": [1, 0, 0, 0], "time": [5.0, 4.0, 6.0, 1.5]}
    lags, missing = freshness._lags(window, seen)
    assert lags.tolist() == [3.0, 1.5] and missing == 0
    lags, missing = freshness._lags(window, {"slot": [0], "offset": [1], "time": [5.0]})
    assert lags.tolist() == [3.0] and missing == 1

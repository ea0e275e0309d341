"""The names a topic's table is made from (table/names.py): the default name, the syntax of
`neve.iceberg.table` and `neve.iceberg.partition.by`, and which two topics would share a table."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from table.names import (
    InvalidName,
    PartitionTerm,
    Topic,
    default_table_name,
    parse_partition_by,
    parse_table_config,
    table_collision,
    table_identifier,
)

TOPIC_NAMES = st.text(alphabet="abcXYZ019._-", min_size=1, max_size=20)


@given(TOPIC_NAMES)
def test_a_default_name_holds_only_identifier_characters_and_keeps_the_length(topic):
    name = default_table_name(topic)
    assert len(name) == len(topic) and set(name) <= set("abcXYZ019_")


def test_look_alike_topics_share_a_table_name_and_are_told_apart_by_the_collision_check():
    assert {default_table_name(t) for t in ("orders.eu", "orders-eu", "orders_eu")} == {"orders_eu"}
    live = [Topic("orders.eu", {})]
    assert table_collision("orders-eu", {}, live) == "orders.eu"
    assert table_collision("orders_eu", {}, live) == "orders.eu"
    assert table_collision("ORDERS_EU", {}, live) == "orders.eu"  # engines resolve unquoted names without case
    assert table_collision("orders.eu", {}, live) is None  # itself
    assert table_collision("orders_us", {}, live) is None
    # a table config is the topic's table name, both ways
    assert table_collision("a", {"neve.iceberg.table": "orders_eu"}, live) == "orders.eu"
    assert table_collision("a", {"neve.iceberg.table": "neve.orders_eu"}, live) == "orders.eu"
    assert table_collision("orders_eu", {}, [Topic("b", {"neve.iceberg.table": "lake.orders_eu"})]) == "b"
    assert table_collision("x", {"neve.iceberg.table": "lake.t"}, [Topic("y", {"neve.iceberg.table": "sea.t"})]) is None
    # a config stored unchecked by an older neve still holds its topic's default name
    assert table_collision("bad_one", {}, [Topic("bad.one", {"neve.iceberg.table": "x; DROP"})]) == "bad.one"


@pytest.mark.parametrize("value, parsed", [("t", (None, "t")), (" lake.T_1 ", ("lake", "T_1")), ("_x._y", ("_x", "_y"))])
def test_a_table_config_is_one_identifier_after_at_most_one_namespace(value, parsed):
    assert parse_table_config(value) == parsed


@pytest.mark.parametrize(
    "value",
    ['neve.x" AS SELECT 1; COPY (SELECT 42) TO \'/tmp/f\'; --', "a.b.c", "1abc", "a-b", "a b", "a.", ".a", "", "ns.`t`", "t;", "é"],
)
def test_a_table_config_that_is_not_an_identifier_is_refused(value):
    with pytest.raises(InvalidName, match="neve.iceberg.table"):
        parse_table_config(value)


def test_the_identifier_is_the_configs_in_the_compactors_namespace_or_the_default_name():
    assert table_identifier("neve", "orders.eu", {}) == "neve.orders_eu"
    assert table_identifier("neve", "orders.eu", {"neve.iceberg.table": "eu"}) == "neve.eu"
    assert table_identifier("neve", "orders.eu", {"neve.iceberg.table": "lake.eu"}) == "lake.eu"


def test_partition_configs_parse_to_terms():
    assert parse_partition_by(None) == [PartitionTerm("day", "timestamp")]
    assert parse_partition_by(" NONE ") == [] and parse_partition_by("") == []
    assert parse_partition_by("Hour(timestamp), identity(partition), bucket[ 8 ](key_raw), truncate[4](value.a.b)") == [
        PartitionTerm("hour", "timestamp"),
        PartitionTerm("identity", "partition"),
        PartitionTerm("bucket[8]", "key_raw"),
        PartitionTerm("truncate[4]", "value.a.b"),
    ]


@pytest.mark.parametrize(
    "text, error",
    [
        ("week(timestamp)", "unknown transform 'week'"),
        ("bucket[0](partition)", "unknown transform 'bucket'"),
        ("bucket(partition)", "unknown transform 'bucket'"),
        ("day timestamp", "'day timestamp' is not transform(column)"),
        ("day(timestamp), ", "'' is not transform(column)"),
        ("day(a b)", "is not transform(column)"),
        ("day(x'); DROP TABLE t; --)", "is not transform(column)"),
    ],
)
def test_a_partition_config_that_does_not_parse_says_why(text, error):
    with pytest.raises(InvalidName, match="neve.iceberg.partition.by") as caught:
        parse_partition_by(text)
    assert error in str(caught.value)

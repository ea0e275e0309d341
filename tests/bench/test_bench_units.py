"""Unit tests of the benchmark suite's parsers: py-spy's collapsed stacks and Prometheus text."""

from __future__ import annotations

from bench.profile import hot_frames
from bench.servers import parse_prometheus


def test_hot_frames_merges_lines_of_a_function_and_keeps_neve_frames_on_the_stack(tmp_path):
    raw = tmp_path / "profile.txt"
    raw.write_text(
        "main (neve/cli.py:69);run (asyncio/runners.py:118);encode (wal/format.py:100) 30\n"
        "main (neve/cli.py:69);run (asyncio/runners.py:118);encode (wal/format.py:108) 50\n"
        "main (neve/cli.py:69);run (asyncio/runners.py:118) 20\n"
        "not a stack line\n"
    )
    prof = hot_frames(raw)
    assert prof["samples"] == 100
    assert prof["self"] == [["encode (wal/format.py)", 80, 80.0], ["run (asyncio/runners.py)", 20, 20.0]]
    assert prof["total"] == [["main (neve/cli.py)", 100, 100.0], ["encode (wal/format.py)", 80, 80.0]]


def test_hot_frames_of_an_empty_profile(tmp_path):
    raw = tmp_path / "empty.txt"
    raw.write_text("")
    assert hot_frames(raw) == {"samples": 0, "self": [], "total": []}


def test_parse_prometheus_keeps_labels_and_skips_comments():
    text = '# HELP x y\n# TYPE x counter\nneve_metadata_ops_total 255.0\nSeaweedFS_s3_request_total{bucket="neve",type="PUT"} 40\nbroken line\n'
    assert parse_prometheus(text) == {"neve_metadata_ops_total": 255.0, 'SeaweedFS_s3_request_total{bucket="neve",type="PUT"}': 40.0}

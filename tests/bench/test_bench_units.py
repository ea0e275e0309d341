"""Unit tests of the benchmark suite's parsers (py-spy's collapsed stacks, Prometheus text) and of how
its latency plot groups a run's curves."""

from __future__ import annotations

import numpy as np

from bench.profile import hot_frames
from bench.report import _twos_and_fives, latency_panels
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


def test_latency_panels_one_per_system_and_one_color_per_step_kind():
    ms = np.array([0.1, 0.2])
    ack = {"1KiB-saturation": ms, "1KiB-fixed": ms, "tansu/1KiB-saturation": ms, "tansu/1KiB-fixed": ms, "sink/1KiB-saturation": ms}
    panels = latency_panels(ack, {"1KiB-fixed": ms}, "neve-s3")
    assert {who: [(c.label, c.kind, c.color) for c in curves] for who, curves in panels.items()} == {
        "neve-s3": [("ack 1KiB-saturation", "ack", 0), ("ack 1KiB-fixed", "ack", 1), ("e2e 1KiB-fixed", "e2e", 1)],
        "tansu": [("ack 1KiB-saturation", "ack", 0), ("ack 1KiB-fixed", "ack", 1)],
        "sink": [("ack 1KiB-saturation", "ack", 0)],
    }
    assert latency_panels({}, {}, "neve-s3") == {}


def test_minor_ticks_of_the_latency_axis_are_labelled_at_2s_and_5s():
    assert [_twos_and_fives(v, None) for v in (0.2, 0.3, 20, 30, 50, 60, 200, 500, 700, 5000, 0)] == ["0.2", "", "20", "", "50", "", "200", "500", "", "5000", ""]


async def test_a_ceiling_window_on_a_slow_store_lasts_until_enough_puts_finished():
    """A quick window (0.05 s) over a store whose PUT takes 0.1 s: it still measures MIN_PUTS
    PUTs, over the time they took, instead of reading 0 MB/s."""
    import asyncio
    import io

    from bench.ceiling import MIN_PUTS, _measure
    from bench.progress import Progress

    class SlowStore:
        puts = 0

        async def put(self, key: str, data: bytes) -> None:
            await asyncio.sleep(0.1)
            self.puts += 1

    store = SlowStore()
    measured = await _measure(store, 1024, 1, 0.0, 0.05, Progress("test", io.StringIO()), dict)
    assert measured["puts"] == MIN_PUTS == store.puts
    assert measured["window_s"] >= MIN_PUTS * 0.1
    assert measured["mb_per_s"] > 0 and measured["errors"] == []

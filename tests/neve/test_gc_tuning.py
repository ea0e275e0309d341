"""The broker process's collector settings (BrokerConfig.gc_young_threshold): set from config,
with 0 leaving CPython's own."""

from __future__ import annotations

import gc

from neve.cli import tune_gc
from neve.config import load_config


def test_gc_thresholds_follow_config():
    before = gc.get_threshold()
    try:
        tune_gc(load_config(None, env={"NEVE_BROKER_GC_YOUNG_THRESHOLD": "12345"}).broker.gc_young_threshold)
        assert gc.get_threshold() == (12345, 20, 100)
        assert gc.get_freeze_count() > 0
        gc.set_threshold(*before)
        tune_gc(0)
        assert gc.get_threshold() == before
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)

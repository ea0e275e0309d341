"""Smoke run of `python -m bench security --quick`: one `neve dev` with a PLAINTEXT and a SASL_SSL
listener (certificates and a SCRAM-SHA-512 user made for the run), a produce step and a backlog
read over each. Checked: both listeners' figures are there and sane (every record acknowledged and
read back once, MB/s and broker CPU per GiB positive), the SASL_SSL steps authenticated and the
PLAINTEXT ones did not, and the ratios and the judgement against the 0.7 target are reported. No
assertion on the figures' size: the machine is shared."""

from __future__ import annotations

import pytest

from .test_bench_smoke import check_document, run_bench

pytestmark = pytest.mark.integration

LISTENERS = ("PLAINTEXT", "SASL_SSL")
FIGURES = {"produce MB/s", "produce: broker CPU-s per GiB", "produce: ack p99 ms", "consume MB/s", "consume: broker CPU-s per GiB"}


def test_security_quick(tmp_path) -> None:
    doc, out = run_bench(tmp_path, "security")
    check_document(doc, "security")
    by_name = {s["name"]: s for s in doc["steps"]}
    assert sorted(by_name) == sorted(f"{listener}/1KiB-{kind}-r1" for listener in LISTENERS for kind in ("produce", "consume"))
    for listener in LISTENERS:
        produce, read = by_name[f"{listener}/1KiB-produce-r1"], by_name[f"{listener}/1KiB-consume-r1"]
        assert produce["errors"] == [] and read["errors"] == []
        assert produce["mode"] == "saturation" and produce["record_bytes"] == 1024
        assert produce["produced"] > 0 and produce["acked"] == produce["produced"] and produce["failed"] == 0
        assert produce["mb_per_s"] > 0 and produce["broker_cpu_s_per_gib_produced"] > 0
        # the read step produced nothing and read the produce step's topic, every record once, in order
        assert read["mode"] == "backlog-read" and read["topic"] == produce["topic"] and read["produced"] == 0
        assert read["backlog_records"] == produce["acked"]
        assert read["consumed_per_consumer"] == [produce["acked"]] and read["consumer_offset_anomalies"] == 0
        assert read["consume_mb_per_s"] > 0 and read["broker_cpu_s_per_gib_consumed"] > 0
        # its window is the whole read: every record of the backlog arrived inside it
        read_in_window = read["consume_mb_per_s"] * 1e6 * read["window_s"] / read["record_bytes"]
        assert read_in_window == pytest.approx(produce["acked"], rel=0.01)

    security = doc["derived"]["security"]
    assert (security["record_bytes"], security["mechanism"], security["rounds"]) == (1024, "SCRAM-SHA-512", 1)
    # each SASL_SSL client (the admin client, the producer's probe and itself, the consumer) logged in; no PLAINTEXT one did
    logins = security["sasl_authentications"]
    assert logins["PLAINTEXT"] == 0 and logins["SASL_SSL"] >= 4, logins
    figures = security["figures"]
    assert set(figures) == FIGURES
    for title, figure in figures.items():
        assert figure["PLAINTEXT"] > 0 and figure["SASL_SSL"] > 0, title
        assert figure["ratio"] == pytest.approx(figure["SASL_SSL"] / figure["PLAINTEXT"], abs=0.002) and figure["round_ratios"] == [figure["ratio"]], title
    # the judgement: both MB/s ratios against the target at 1 KiB records, met or not on this machine
    targets = {t["name"]: t for t in doc["targets"]}
    for kind in ("produce", "consume"):
        target = targets[f"{kind} MB/s: SASL_SSL / PLAINTEXT at 1KiB records"]
        assert target["target"] == ">= 0.7 (at 1KiB records)"
        assert target["measured"] == figures[f"{kind} MB/s"]["ratio"] and target["met"] == (target["measured"] >= 0.7)
    report = (out / "results.md").read_text()
    assert report.startswith("# bench: security (quick)")
    assert "SASL_SSL (SCRAM-SHA-512) beside PLAINTEXT" in report

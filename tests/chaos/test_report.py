"""The report a person reads: the counts by class, each anomaly with the history lines that show it,
the fault windows, and a plot file that is a PNG."""

from __future__ import annotations

from chaos import history, report
from chaos.checker import check


def test_report_names_each_anomaly_with_its_history_and_draws_the_faults(tmp_path):
    recorder = history.Recorder(tmp_path / "history.jsonl")
    opened = recorder.invoke(1, "open", {"role": "consumer", "isolation": "read_committed"})
    recorder.complete(opened, history.OK, opened["value"])
    send = recorder.invoke(0, "send", [["send", "t/0", 7]])
    recorder.complete(send, history.OK, [["send", "t/0", [0, 7]]])
    recorder.fault("pause", "start", {"node": "broker1"})
    send = recorder.invoke(0, "send", [["send", "t/0", 8]])
    recorder.complete(send, history.OK, [["send", "t/0", [1, 8]]])
    recorder.fault("pause", "stop", {"node": "broker1"})
    poll = recorder.invoke(1, "poll", [["poll"]])
    # 9 was never sent; 8 is read at an offset it was not acknowledged at
    recorder.complete(poll, history.OK, [["poll", {"t/0": [[0, 7], [1, 9], [2, 8]]}]])
    recorder.close()
    ops = history.read(tmp_path / "history.jsonl")
    result = check(ops)

    path = report.write(tmp_path / "out", ops, result, {"workloads": ["queue"], "nemesis": "pause"})

    text = path.read_text()
    assert f"**{result.count} anomalies**" in text and result.count >= 2
    assert "| unexpected-value | 1 |" in text
    assert "## unexpected-value (1)" in text
    # the excerpt holds the poll that read 9, as recorded
    assert '"t/0":[[0,7],[1,9],[2,8]]' in text
    assert report.fault_windows(ops) == [("pause", ops[4]["time"], ops[7]["time"], {"node": "broker1"})]
    assert "pause: " in text
    assert (tmp_path / "out" / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "out" / "anomalies.json").exists()


def test_a_fault_still_open_at_the_end_is_shaded_to_the_end():
    ops = [
        {"index": 0, "time": 1.0, "process": "nemesis", "type": "info", "f": "kill", "value": "broker0", "phase": "start"},
        {"index": 1, "time": 5.0, "process": 0, "type": "invoke", "f": "poll", "value": [["poll"]]},
    ]
    assert report.fault_windows(ops) == [("kill", 1.0, 5.0, "broker0")]

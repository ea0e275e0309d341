"""The workers' history files merge into one history on the run's clock, and the progress counts
read only whole lines."""

from __future__ import annotations

from chaos import history
from chaos.workloads.worker import count, merge


def test_files_on_one_clock_merge_by_time_with_indexes_renumbered(tmp_path):
    start = 1000.0
    a = history.Recorder(tmp_path / "a.jsonl", start=start, id_base=10)
    b = history.Recorder(tmp_path / "b.jsonl", start=start, id_base=20)
    a.now = b.now = None  # times are set by hand below
    for recorder, process, times in ((a, 10, (0.5, 2.0)), (b, 20, (1.0, 1.5))):
        recorder.now = iter(times).__next__
        op = recorder.invoke(process, "poll", [["poll"]])
        recorder.complete(op, history.OK, [["poll", {}]])
        recorder.close()

    ops = merge([tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "missing.jsonl"], tmp_path / "history.jsonl")

    assert [(op["index"], op["time"], op["process"], op["type"]) for op in ops] == [(0, 0.5, 10, "invoke"), (1, 1.0, 20, "invoke"), (2, 1.5, 20, "ok"), (3, 2.0, 10, "ok")]
    assert history.read(tmp_path / "history.jsonl") == ops
    assert [(i.get("process"), c and c["type"]) for i, c in history.pairs(ops)] == [(20, "ok"), (10, "ok")]


def test_counts_take_whole_lines_only_and_resume_where_they_stopped(tmp_path):
    path = tmp_path / "h.jsonl"
    recorder = history.Recorder(path)
    op = recorder.invoke(1, "send", [["send", "t/0", 1]])
    recorder.complete(op, history.OK, [["send", "t/0", [0, 1]]])
    recorder.close()
    with open(path, "a") as f:
        f.write('{"index": 2, "f": "send"')  # a line still being written
    offsets, counts = {}, {}
    count([path, tmp_path / "none.jsonl"], offsets, counts)
    assert counts == {("send", "invoke"): 1, ("send", "ok"): 1}
    with open(path, "a") as f:
        f.write(', "type": "invoke"}\n')
    count([path], offsets, counts)
    assert counts == {("send", "invoke"): 2, ("send", "ok"): 1}

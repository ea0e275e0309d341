"""What a person reads after a run: report.md (the run, the counts by anomaly class, each anomaly
with the history lines that show it), anomalies.json for scripts, and plot.png — throughput and
latency of the clients' operations over time with the nemesis's fault windows shaded, as Jepsen
draws them."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from .history import INVOKE, NEMESIS, Op, pairs

EXCERPT_CONTEXT = 2  # ops of the same processes around each named op
MAX_SHOWN = 20  # anomalies of one class written out in full; the rest are counted


HEAL = "heal"  # the run's heal: not a fault, the moment after which the cluster owes every answer


def fault_windows(ops: list[Op]) -> list[tuple[str, float, float, Any]]:
    """(fault, start, stop, what it hit) for every fault the nemesis recorded; one still open at the
    end of the history closes there. The heal is not one of them."""
    end = ops[-1]["time"] if ops else 0.0
    open_faults: dict[str, list[Op]] = defaultdict(list)
    windows = []
    for op in ops:
        if op["process"] != NEMESIS or op["f"] == HEAL:
            continue
        phase = op.get("phase")
        if phase == "start":
            open_faults[op["f"]].append(op)
        elif phase == "stop" and open_faults[op["f"]]:
            began = open_faults[op["f"]].pop(0)
            windows.append((op["f"], began["time"], op["time"], began.get("value")))
    for f, started in open_faults.items():
        windows += [(f, op["time"], end, op.get("value")) for op in started]
    return sorted(windows, key=lambda w: w[1])


def latencies(ops: list[Op]) -> list[tuple[str, str, float, float]]:
    """(f, completion type, invoke time, seconds taken) of every completed client op."""
    out = []
    for invocation, completion in pairs(ops):
        if completion is None or invocation is completion or invocation["type"] != INVOKE:
            continue
        out.append((invocation["f"], completion["type"], invocation["time"], completion["time"] - invocation["time"]))
    return out


def plot(ops: list[Op], path: Path, title: str) -> None:
    """Two panels over the run's time: ok ops per second by f, and each op's latency (log scale,
    coloured by outcome); fault windows shaded in both, labelled by fault."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lat = [row for row in latencies(ops) if row[0] in ("send", "poll", "txn", "commit", "offsets")]
    end = max((op["time"] for op in ops), default=1.0)
    fig, (rate_ax, lat_ax) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    buckets: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for f, type_, start, took in lat:
        if type_ == "ok":
            buckets[f][int(start + took)] += 1
    for f, counts in sorted(buckets.items()):
        xs = list(range(int(end) + 1))
        rate_ax.plot(xs, [counts.get(x, 0) for x in xs], label=f, linewidth=1)
    rate_ax.set_ylabel("ok ops / s")
    rate_ax.legend(loc="upper right", fontsize=8)
    colours = {"ok": "tab:blue", "fail": "tab:red", "info": "tab:orange"}
    for type_, colour in colours.items():
        points = [(start, max(took, 1e-4)) for _, t, start, took in lat if t == type_]
        if points:
            lat_ax.scatter([p[0] for p in points], [p[1] for p in points], s=3, c=colour, label=type_, alpha=0.6)
    lat_ax.set_yscale("log")
    lat_ax.set_ylabel("latency (s)")
    lat_ax.set_xlabel("time since the run began (s)")
    lat_ax.legend(loc="upper right", fontsize=8)
    palette = plt.get_cmap("tab10")
    kinds = sorted({w[0] for w in fault_windows(ops)})
    for f, start, stop, _ in fault_windows(ops):
        colour = palette(kinds.index(f) % 10)
        for ax in (rate_ax, lat_ax):
            ax.axvspan(start, max(stop, start + 0.2), color=colour, alpha=0.15, linewidth=0)
        rate_ax.text(start, rate_ax.get_ylim()[1] * 0.95, f, fontsize=7, rotation=90, va="top", color=colour)
    for op in ops:
        if op["process"] == NEMESIS and op["f"] == HEAL and op.get("phase") == "start":
            for ax in (rate_ax, lat_ax):
                ax.axvline(op["time"], color="black", linestyle="--", linewidth=1)
            rate_ax.text(op["time"], rate_ax.get_ylim()[1] * 0.95, " healed", fontsize=7, va="top")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def excerpt(ops: list[Op], indexes: list[int], context: int = EXCERPT_CONTEXT) -> list[Op]:
    """The named ops, and the ops of the same processes just before and after each (their invoke
    or completion), in history order."""
    by_index = {op["index"]: op for op in ops}
    processes = {by_index[i]["process"] for i in indexes if i in by_index}
    wanted: set[int] = set(indexes)
    by_process: dict[Any, list[int]] = defaultdict(list)
    for op in ops:
        if op["process"] in processes:
            by_process[op["process"]].append(op["index"])
    for i in indexes:
        if i not in by_index:
            continue
        own = by_process[by_index[i]["process"]]
        at = own.index(i)
        wanted.update(own[max(0, at - context) : at + context + 1])
    return [by_index[i] for i in sorted(wanted) if i in by_index]


def _line(op: Op) -> str:
    text = json.dumps(op, separators=(",", ":"))
    return text if len(text) <= 600 else text[:600] + " …"


def write(out_dir: Path, ops: list[Op], result, about: dict[str, Any]) -> Path:
    """report.md, anomalies.json and plot.png in `out_dir`; returns report.md's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    title = f"{', '.join(about.get('workloads', []))} under {about.get('nemesis', '?')}" + (f", plant {about['plant']}" if about.get("plant") else "")
    plot_error = None
    try:
        plot(ops, out_dir / "plot.png", title)
    except Exception as e:  # a plot is not worth losing the report over
        plot_error = f"{type(e).__name__}: {e}"
    (out_dir / "anomalies.json").write_text(json.dumps(result.to_json(), indent=1, default=str))
    lines = [f"# chaos run: {title}", ""]
    lines += [f"- {k}: {v}" for k, v in about.items()]
    lines += ["", f"**{result.count} anomalies**", ""]
    if result.count:
        lines += ["| class | count |", "| --- | --- |"]
        lines += [f"| {cls} | {len(found)} |" for cls, found in sorted(result.anomalies.items()) if found]
        lines.append("")
    lines += ["## Operations", "", "| f | ok | fail | info |", "| --- | --- | --- | --- |"]
    outcomes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for op in ops:
        if op["process"] != NEMESIS and op["type"] != INVOKE:
            outcomes[op["f"]][op["type"]] += 1
    lines += [f"| {f} | {c['ok']} | {c['fail']} | {c['info']} |" for f, c in sorted(outcomes.items())]
    lines += ["", "## Faults", ""]
    windows = fault_windows(ops)
    lines += [f"- {start:7.1f}s - {stop:7.1f}s  {f}: {json.dumps(value, default=str)}" for f, start, stop, value in windows] or ["- none"]
    lines += ["", "![throughput and latency](plot.png)" if plot_error is None else f"(no plot: {plot_error})", ""]
    for cls, found in sorted(result.anomalies.items()):
        if not found:
            continue
        lines += [f"## {cls} ({len(found)})", ""]
        for anomaly in found[:MAX_SHOWN]:
            lines += [f"### {anomaly.message}", "", "```"]
            lines += [_line(op) for op in excerpt(ops, list(anomaly.ops))]
            lines += ["```", ""]
        if len(found) > MAX_SHOWN:
            lines += [f"... and {len(found) - MAX_SHOWN} more in anomalies.json", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path

"""Writing a run's results: result.json (everything), results.md (the tables a person reads), and
PNG plots: latency CDFs of every step (a panel per system when a run has a peer or the sink), and
throughput against partition count when a run has saturation steps at more than one partition count."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .run import Run


def write(run: Run, doc: dict) -> list[Path]:
    out = run.out_dir
    written = [out / "result.json", out / "results.md"]
    (out / "result.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "results.md").write_text(markdown(doc))
    written += plots(run, doc)
    return written


# -- Markdown -----------------------------------------------------------------------------------


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _size(n: int | None) -> str:
    if n is None:
        return "–"
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    if n >= 2**20:
        return f"{n / 2**20:.2f} MiB"
    return f"{n} B"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


_PRODUCER_CLIENT = {"c": " (producers: librdkafka driven from C)", "python": " (producers: confluent-kafka from Python)"}


def markdown(doc: dict) -> str:
    m = doc["machine"]
    parts = [
        f"# bench: {doc['scenario']}{' (quick)' if doc['quick'] else ''}\n",
        f"`{doc['command']}` — {doc['started_at']}, {doc['elapsed_s']} s, neve {m['neve_commit']}, "
        f"**{'OK' if doc['ok'] else 'FAILED'}**\n",
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}, librdkafka {m['librdkafka']}{_PRODUCER_CLIENT.get(doc.get('options', {}).get('client'), '')}; load average {m['loadavg_at_start']} before the run.\n",
    ]
    if doc["system"]:
        s = doc["system"]
        wal = s.get("wal")
        settings = f", WAL linger {wal['linger_ms']} ms, flush at {_size(wal['flush_bytes'])}, {wal['max_inflight_uploads']} uploads in flight" if wal else ""
        peer = f"; peer {s['peer']['name']} ({s['peer']['object_store']})" if s.get("peer") else ""
        parts.append(f"System: {s['name']} (objects {s['object_store'].split('?')[0]}, metadata {s['metadata'].split('?')[0]}){settings}{peer}.\n")
    if doc["steps"]:
        parts.append("\n## Steps\n\nMB = 10^6 bytes of record values; latencies in ms; CPU in broker CPU-seconds per GiB; busy cores: the whole machine's (client, broker, etcd, SeaweedFS) over the window.\n\n")
        rows = []
        for s in doc["steps"]:
            a = s["ack_latency_ms"]
            e = s["e2e_latency_ms"] or {}
            rows.append(
                [
                    s["name"],
                    _size(s["record_bytes"]),
                    _fmt(s["partitions"]),
                    s["mode"] + (f" {s['offered_records_per_s']:,.0f}/s" if s["offered_records_per_s"] else ""),
                    _fmt(s["records_per_s"], 0),
                    _fmt(s["mb_per_s"], 2),
                    f"{_fmt(a['p50'])} / {_fmt(a['p99'])} / {_fmt(a['p999'])}",
                    f"{_fmt(e.get('p50'))} / {_fmt(e.get('p99'))}" if e else "–",
                    _fmt(s["consume_mb_per_s"], 2),
                    _fmt(s["broker_cpu_s_per_gib_produced"]),
                    _fmt(s["machine_busy_cores"], 2),
                    _fmt(s["puts_per_gib"]),
                    _size(s["mean_object_bytes"]),
                    _fmt(s["ratio_to_put_ceiling"], 2),
                    "ok" if not s["errors"] and s["acked"] == s["produced"] else "**" + "; ".join(s["errors"][:2] or ["acked != produced"]) + "**",
                ]
            )
        parts.append(
            _table(
                ["step", "record", "partitions", "load", "records/s", "MB/s", "ack p50 / p99 / p99.9", "e2e p50 / p99", "consume MB/s", "CPU-s/GiB", "busy cores", "PUTs/GiB", "object", "× ceiling", "check"],
                rows,
            )
        )
    if doc["baselines"]:
        parts.append("\n## Baselines\n\n")
        puts = [b for b in doc["baselines"] if "object_bytes" in b]
        txns = [b for b in doc["baselines"] if "txn_latency_ms" in b]
        if puts:
            rows = [
                [
                    b["name"], b["backend"], _size(b["object_bytes"]), _fmt(b["concurrency"]), _fmt(b["puts_per_s"]), _fmt(b["mb_per_s"], 1),
                    f"{_fmt(b['put_latency_ms']['p50'])} / {_fmt(b['put_latency_ms']['p99'])}", _fmt(b["machine_busy_cores"], 2),
                ]
                for b in puts
            ]
            parts.append(_table(["baseline", "store", "object", "concurrency", "PUT/s", "MB/s", "PUT p50 / p99 ms", "busy cores"], rows))
        if txns:
            rows = [
                [b["name"], b["backend"], _fmt(b["partitions"]), _fmt(b["ops_per_txn"]), _fmt(b["txns_per_s"]), f"{_fmt(b['txn_latency_ms']['p50'])} / {_fmt(b['txn_latency_ms']['p99'])}"]
                for b in txns
            ]
            parts.append("\n" + _table(["baseline", "store", "heads compared", "puts", "txn/s (one at a time)", "txn p50 / p99 ms"], rows))
    if doc["targets"]:
        parts.append("\n## Targets\n\n")
        rows = [[t["name"], t["target"], _fmt(t["measured"], 2), "–" if t["met"] is None else ("met" if t["met"] else "**missed**")] for t in doc["targets"]]
        parts.append(_table(["target", "wanted", "measured", ""], rows))
    for name, table in doc["derived"].get("tables", {}).items():
        parts.append(f"\n## {name}\n\n")
        parts.append(_table(table["headers"], table["rows"]))
    for step, prof in doc["derived"].get("profiles", {}).items():
        parts.append(f"\n## Profile of the broker during {step} (py-spy, {prof['samples']:,} samples)\n\n")
        rows = [[f"`{frame}`", f"{pct}%"] for frame, _n, pct in prof["self"]]
        parts.append(_table(["hottest frames (self)", "share"], rows))
        rows = [[f"`{frame}`", f"{pct}%"] for frame, _n, pct in prof["total"]]
        parts.append("\n" + _table(["on the stack (total)", "share"], rows))
    if doc["notes"]:
        parts.append("\n## Notes\n\n" + "".join(f"- {n}\n" for n in doc["notes"]))
    return "".join(parts)


# -- plots --------------------------------------------------------------------------------------


def plots(run: Run, doc: dict) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    written = []
    panels = latency_panels(run.ack_samples, run.e2e_samples, (doc.get("system") or {}).get("name", "neve"))
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(2 + 5 * len(panels), 4.5), sharex=True, sharey=True, squeeze=False)
        colors = plt.get_cmap("tab10").colors
        for ax, (who, curves) in zip(axes[0], panels.items(), strict=True):
            for curve in curves:
                _cdf(ax, curve.samples, curve.label, "--" if curve.kind == "e2e" else "-", colors[curve.color % len(colors)])
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(_twos_and_fives))
            ax.tick_params(axis="x", which="minor", labelsize=7)
            ax.set_xlabel("latency (ms, log scale)")
            ax.set_ylim(0, 1.0)
            ax.grid(True, which="both", alpha=0.3)
            ax.set_title(who if len(panels) > 1 else f"{doc['scenario']}: latency CDF")
            ax.legend(fontsize=7, loc="lower right")
        axes[0][0].set_ylabel("fraction of records")
        if len(panels) > 1:
            fig.suptitle(f"{doc['scenario']}: latency CDF")
        path = run.out_dir / "latency_cdf.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    saturated = [s for s in doc["steps"] if s["mode"] == "saturation"]
    if len({s["partitions"] for s in saturated}) > 1:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        lines: dict[tuple[str, int], list[dict]] = {}  # (system, or "sink", record size) -> steps
        for s in saturated:
            lines.setdefault(("sink" if s["name"].startswith("sink/") else s["system"], s["record_bytes"]), []).append(s)
        for (who, size), steps in sorted(lines.items()):
            steps.sort(key=lambda s: s["partitions"])
            ax.plot([s["partitions"] for s in steps], [s["mb_per_s"] for s in steps], marker="o", label=f"{who}, {_size(size)} records")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_xlabel("partitions (log scale)")
        ax.set_ylabel("produce throughput (MB/s)")
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(f"{doc['scenario']}: throughput against partition count")
        ax.legend()
        path = run.out_dir / "throughput_vs_partitions.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def _twos_and_fives(value: float, _pos) -> str:
    """Labels for a log axis's minor ticks: the 2s and 5s between powers of ten (20, 50, 200, ...)."""
    if value <= 0:
        return ""
    leading = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if leading in (2, 5) else ""


@dataclass(frozen=True)
class Curve:
    label: str  # "ack 1KiB-fixed"
    kind: str  # "ack" or "e2e"
    color: int  # one per step kind ("1KiB-fixed"), the same in every panel
    samples: np.ndarray


def latency_panels(ack: dict[str, np.ndarray], e2e: dict[str, np.ndarray], system: str) -> dict[str, list[Curve]]:
    """The latency curves of a run, one panel per system that ran its steps: a step named
    "tansu/1KiB-fixed" is tansu's (or the sink's, "sink/..."), one with no prefix the system's
    under test (`system`). A step kind keeps its color from panel to panel, so one panel compares
    the steps of a system and the same color compares systems."""
    panels: dict[str, list[Curve]] = {}
    colors: dict[str, int] = {}
    for kind, samples_by_step in (("ack", ack), ("e2e", e2e)):
        for name, samples in samples_by_step.items():
            who, _, step = name.rpartition("/")
            color = colors.setdefault(step, len(colors))
            panels.setdefault(who or system, []).append(Curve(f"{kind} {step}", kind, color, samples))
    return panels


def _cdf(ax, samples: np.ndarray, label: str, style: str, color) -> None:
    if samples.size == 0:
        return
    ms = np.sort(samples * 1000.0)
    if ms.size > 5000:  # plotting every point of a million-sample run adds nothing visible
        ms = ms[np.linspace(0, ms.size - 1, 5000).astype(int)]
    ms = np.maximum(ms, 1e-3)
    ax.plot(ms, np.linspace(0, 1, ms.size), style, color=color, label=label, linewidth=1.2)

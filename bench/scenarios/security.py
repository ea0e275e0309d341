"""security: what TLS and SASL cost. One broker serves a PLAINTEXT listener and a SASL_SSL one
(TLS with development certificates made for the run, SCRAM-SHA-512 by default); the same
producers and consumers run the same steps over each, in the same run:

1. produce: one saturation step into a fresh topic (MB/s, broker CPU-s per GiB produced);
2. consume: consumers read that topic from offset 0 while nothing is produced (a catch-up read,
   MB/s and broker CPU-s per GiB read); the window is the whole read, from the consumers'
   assignment to the backlog's last record (`--warmup` and `--duration` are the produce steps').

The listeners take turns in rounds (`--rounds`), the order swapped each round (PLAINTEXT first,
then SASL_SSL first, ...), so a machine that gets busier or quieter during the run weighs on both
alike. Each figure is the median over the rounds; each ratio (SASL_SSL / PLAINTEXT) the median of
the rounds' own ratios, judged against the target: SASL_SSL at least 0.7 of PLAINTEXT in MB/s at
1 KiB records (TLS should cost what OpenSSL costs).
"""

from __future__ import annotations

import secrets
import statistics

from ..load import Load
from ..options import size, size_label
from ..stats import ratio
from ..tls import make_certificates

NAME = "security"
HELP = "produce and consume MB/s and broker CPU over SASL_SSL (TLS + SCRAM) beside PLAINTEXT"
TARGET_RATIO = 0.7
TARGET_RECORD_BYTES = 1024  # the size the target is set at; other sizes are reported, not judged
PLAIN, SECURE = "PLAINTEXT", "SASL_SSL"
USER = "bench"
# A consume step's window is the whole read: it opens as the consumers are assigned their
# partitions and closes when they have read the backlog, or after this long.
READ_LIMIT_S = 120.0
SASL_METRIC = "neve_sasl_authentications_total"  # broker/metrics.py

# (figure in the table, step kind, key of the step record, higher is better)
FIGURES = (
    ("produce MB/s", "produce", "mb_per_s", True),
    ("produce: broker CPU-s per GiB", "produce", "broker_cpu_s_per_gib_produced", False),
    ("produce: ack p99 ms", "produce", "ack_latency_ms.p99", False),
    ("consume MB/s", "consume", "consume_mb_per_s", True),
    ("consume: broker CPU-s per GiB", "consume", "broker_cpu_s_per_gib_consumed", False),
)


def add_arguments(parser) -> None:
    parser.add_argument("--record-bytes", type=size, default=1024, help="record size (default 1KiB, the size the 0.7 target is set at)")
    parser.add_argument("--partitions", type=int, default=10, help="partitions of each step's topic (default 10)")
    parser.add_argument("--producers", type=int, default=1, help="producer processes of each produce step (default 1)")
    parser.add_argument("--consumers", type=int, default=1, help="consumer processes of each consume step, each reading every partition (default 1)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of both listeners' steps, the order swapped each round (default 3; quick 1)")
    parser.add_argument("--mechanism", choices=["SCRAM-SHA-512", "SCRAM-SHA-256"], default="SCRAM-SHA-512", help="the SASL mechanism (default SCRAM-SHA-512)")


def run(r) -> None:
    a = r.args
    # `neve dev`'s own compactor would start Spark and compact the first listener's topics inside
    # the second listener's windows; its registry would take port 8081. Neither is measured here
    # (a --broker-env of the user's still wins).
    a.broker_env = [("NEVE_COMPACTOR_IN_NODE", "false"), ("NEVE_REGISTRY_PORT", "0"), *a.broker_env]
    system = r.make_system()
    if not system.neve:
        raise RuntimeError(f"the security scenario sets up neve's listeners; {system.name} is not neve")
    connections = _secure(r, system, a.mechanism)
    rounds = a.rounds if a.rounds is not None else (1 if r.quick else 3)
    produce_timing = r.timing(full=(2.0, 10.0), quick=(0.5, 1.5))
    label = size_label(a.record_bytes)
    steps: dict[str, list[tuple[dict, dict]]] = {PLAIN: [], SECURE: []}
    logins = dict.fromkeys(steps, 0)  # SASL authentications the broker counted during each listener's steps
    for n in range(1, rounds + 1):
        order = (PLAIN, SECURE) if n % 2 else (SECURE, PLAIN)
        r.progress.line(f"round {n} of {rounds}: {' then '.join(order)}")
        for listener in order:
            bootstrap, connection = connections[listener]
            where = {"bootstrap": bootstrap, "connection": connection}
            before = _authentications(system)
            produced = r.load(Load(f"{listener}/{label}-produce-r{n}", a.partitions, a.record_bytes, produce_timing.warmup_s, produce_timing.duration_s, producers=a.producers, stamp=True, **where))
            read = r.load(
                Load(
                    f"{listener}/{label}-consume-r{n}", a.partitions, a.record_bytes, 0.0, READ_LIMIT_S,
                    producers=0, consumers=a.consumers, topic=produced["topic"], backlog_records=produced["acked"], **where,
                )
            )  # fmt: skip
            steps[listener].append((produced, read))
            logins[listener] += _authentications(system) - before
    _judge(r, steps, a.record_bytes, a.mechanism)
    r.derived["security"]["sasl_authentications"] = logins


def _secure(r, system, mechanism: str) -> dict[str, tuple[str, dict]]:
    """Give the broker its SASL_SSL listener (certificates and a SCRAM user made in the run's own
    directory), start it, and return each listener's bootstrap and client settings."""
    directory = r.work_dir / "security"
    certs = make_certificates(directory)
    password = secrets.token_urlsafe(16)
    users = directory / "scram-users"
    users.write_text(f"{USER}:{password}\n")
    users.chmod(0o600)
    system.env.update(
        {
            "NEVE_BROKER_SSL_CERTFILE": certs.cert_file,
            "NEVE_BROKER_SSL_KEYFILE": certs.key_file,
            "NEVE_BROKER_SASL_ENABLED_MECHANISMS": mechanism,
            "NEVE_BROKER_SASL_SCRAM_USERS_FILE": str(users),
        }
    )
    system.add_listener(SECURE)
    r.start_system(system)
    secure = {"security.protocol": "SASL_SSL", "ssl.ca.location": certs.ca_file, "sasl.mechanism": mechanism, "sasl.username": USER, "sasl.password": password}
    r.progress.line(f"{SECURE} listener ({mechanism}) at {system.listener(SECURE)}")
    r.notes.append(
        f"One broker, two listeners: {PLAIN} at {system.bootstrap} and {SECURE} at {system.listener(SECURE)} (TLS with a P-256 certificate from an authority made for "
        f"the run; {mechanism}, one user). The TLS version and cipher are what librdkafka and the broker negotiate by default."
    )
    return {PLAIN: (system.bootstrap, {}), SECURE: (system.listener(SECURE), secure)}


def _authentications(system) -> int:
    """Successful SASL authentications the broker has counted (its Prometheus counter)."""
    return round(sum(v for k, v in system.metrics().items() if k.startswith(f"{SASL_METRIC}{{") and 'result="success"' in k))


def _value(step: dict, key: str):
    value = step
    for part in key.split("."):
        value = value[part]
    return value


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def _judge(r, steps: dict[str, list[tuple[dict, dict]]], record_bytes: int, mechanism: str) -> None:
    rows, figures = [], {}
    for title, kind, key, _higher in FIGURES:
        index = 0 if kind == "produce" else 1
        plain = [_value(pair[index], key) for pair in steps[PLAIN]]
        secure = [_value(pair[index], key) for pair in steps[SECURE]]
        per_round = [ratio(s, p) for p, s in zip(plain, secure, strict=True)]
        figure = {PLAIN: _median(plain), SECURE: _median(secure), "ratio": _median(per_round), "round_ratios": per_round}
        figures[title] = figure
        rounds = ", ".join("–" if x is None else f"{x:.2f}" for x in per_round)
        rows.append([title, _text(figure[PLAIN]), _text(figure[SECURE]), _text(figure["ratio"], 2), rounds])
    r.derived["security"] = {"record_bytes": record_bytes, "mechanism": mechanism, "rounds": len(steps[PLAIN]), "figures": figures}
    r.derived.setdefault("tables", {})[f"{SECURE} ({mechanism}) beside {PLAIN}, {size_label(record_bytes)} records, the same broker (medians over the rounds)"] = {
        "headers": ["figure", PLAIN, SECURE, f"{SECURE} / {PLAIN}", "ratio in each round"],
        "rows": rows,
    }
    r.progress.end()
    judged = record_bytes == TARGET_RECORD_BYTES
    verdicts = []
    for title in ("produce MB/s", "consume MB/s"):
        measured = figures[title]["ratio"]
        met = None if measured is None or not judged else measured >= TARGET_RATIO
        r.target(f"{title}: {SECURE} / {PLAIN} at {size_label(record_bytes)} records", f">= {TARGET_RATIO} (at {size_label(TARGET_RECORD_BYTES)} records)", measured, met)
        verdicts.append((title.split()[0], measured, met))
    said = ", ".join(f"{what} {_text(measured, 2)}" for what, measured, _met in verdicts)
    outcome = [met for _what, _measured, met in verdicts]
    verdict = "not judged" if None in outcome else "met" if all(outcome) else "MISSED"
    r.progress.line(f"{SECURE}/{PLAIN} MB/s at {size_label(record_bytes)}: {said} (target >= {TARGET_RATIO} at {size_label(TARGET_RECORD_BYTES)}): {verdict}")
    r.notes.append(
        "CPU per GiB is the broker process's CPU seconds in the window over the bytes of record values produced (produce steps) or read (consume steps, where nothing is produced). "
        "The consumers are confluent-kafka driven from Python: librdkafka decrypts in its own threads, so when the Python loop and not the broker bounds the consume rate, "
        "the consume MB/s ratio stays near 1 and the broker's CPU per GiB read is what shows the cost of TLS."
    )
    r.notes.append(
        "Each consume step reads the backlog its listener's produce step has just written (what is past the broker's cache of recent objects comes from the object store): "
        "both listeners read alike. Its window is the whole read, so it includes the consumer's connection to the broker it fetches from (librdkafka opens one beside its "
        "bootstrap connection): over SASL_SSL a TLS handshake and a SCRAM exchange, milliseconds against a read of seconds (not so in a --quick run)."
    )


def _text(value, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"

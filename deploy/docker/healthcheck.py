#!/usr/bin/env python3
"""The image's health check (`neve-healthcheck [COMMAND] [--config FILE]`): asks the running neve
command what it serves, with the same configuration it runs with (neve's own loader: defaults, the
TOML file, NEVE_* variables). Without arguments the command is read from PID 1's command line
(`tini -- neve broker ...`), so one HEALTHCHECK covers every command.

  dev, broker  a Kafka ApiVersions round trip on the first listener, over TLS for an SSL or SASL_SSL
               one (ApiVersions needs no authentication), and the broker's registry when it serves one
  registry     GET /subjects, over HTTPS when it serves it (a 401 where it has users is an answer)
  compactor    GET /metrics when compactor.metrics_port is set; otherwise only that it runs

Exit 0 healthy, 1 not (with one line saying why)."""

from __future__ import annotations

import socket
import ssl
import struct
import sys
import urllib.error
import urllib.request
from pathlib import Path

COMMANDS = ("dev", "broker", "registry", "compactor")
TIMEOUT_S = 4.0
API_VERSIONS = 18


def command_line(pid: int = 1) -> list[str]:
    """The arguments of process `pid` (the container's init and, after it, neve's command)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")


def parse(args: list[str]) -> tuple[str, str | None]:
    """(the neve command, its --config file) from a command line or this script's arguments."""
    command = next((a for a in args if a in COMMANDS), None)
    if command is None:
        raise SystemExit(f"neve-healthcheck: no neve command ({', '.join(COMMANDS)}) in {' '.join(args)!r}")
    config = None
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            config = args[i + 1]
        elif arg.startswith("--config="):
            config = arg.split("=", 1)[1]
    return command, config


def local(host: str) -> str:
    """The address to check a listener on from inside its own container."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def tls_context(broker) -> ssl.SSLContext:
    """TLS to the broker's own listener from inside its container: the connection sends no
    credential, so the server's certificate (named for the addresses clients use, not this one)
    is not checked; the broker's own certificate is shown where listeners require one."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if broker.ssl_client_auth != "none" and broker.ssl_certfile:
        ctx.load_cert_chain(broker.ssl_certfile, broker.ssl_keyfile or None, password=broker.ssl_key_password or None)
    return ctx


def api_versions(host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
    """One ApiVersions v0 request; raises unless the broker answers it without an error."""
    client_id = b"neve-healthcheck"
    body = struct.pack(">hhih", API_VERSIONS, 0, 1, len(client_id)) + client_id
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as plain:
        s = tls.wrap_socket(plain) if tls is not None else plain
        s.sendall(struct.pack(">i", len(body)) + body)
        head = _read(s, 4)
        (size,) = struct.unpack(">i", head)
        answer = _read(s, size)
    correlation, error = struct.unpack(">ih", answer[:6])
    if correlation != 1 or error != 0:
        raise RuntimeError(f"ApiVersions answered correlation {correlation}, error {error}")


def _read(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise RuntimeError("connection closed before the answer")
        data += chunk
    return data


def http_ok(url: str) -> None:
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as r:
        if r.status != 200:
            raise RuntimeError(f"{url} answered {r.status}")


def registry_ok(registry, host: str, port: int) -> str:
    """GET /subjects on the registry as it serves (HTTPS when it has a certificate). This check
    holds no credentials: where the registry has users, its 401 is the answer of a registry
    that serves. Its certificate is not checked, as for the Kafka listener."""
    scheme = "https" if registry.tls_cert_file else "http"
    url = f"{scheme}://{local(host)}:{port}/subjects"
    tls = None
    if registry.tls_cert_file:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
        if registry.tls_client_ca_file:  # every client shows a certificate: the registry's own
            tls.load_cert_chain(registry.tls_cert_file, registry.tls_key_file or None)
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S, context=tls) as r:
            if r.status != 200:
                raise RuntimeError(f"{url} answered {r.status}")
    except urllib.error.HTTPError as e:
        if e.code != 401 or not (registry.users_file or registry.scram_users):
            raise
    return url


def check(command: str, config_path: str | None) -> str:
    """Raise if `command`, configured as it runs, does not answer; otherwise say what answered."""
    from neve.config import load_config

    config = load_config(config_path)
    host = local(config.broker.host)
    if command in ("dev", "broker"):
        from broker.listeners import listeners_of

        listener = listeners_of(config.broker)[0]
        host, port = local(listener.host), listener.port
        api_versions(host, port, tls_context(config.broker) if listener.uses_tls else None)
        said = f"Kafka on {host}:{port} ({listener.protocol})"
        if command == "broker" and config.registry.port > 0 and not config.registry.url:  # `neve dev` may run without its registry (8081 taken)
            registry_ok(config.registry, config.registry.host or config.broker.host, config.registry.port)
            said += f", registry on {config.registry.port}"
        return said
    if command == "registry":
        port = config.registry.port if config.registry.port > 0 else 8081
        return registry_ok(config.registry, config.registry.host or config.broker.host, port)
    if config.compactor.metrics_port:
        url = f"http://{host}:{config.compactor.metrics_port}/metrics"
        http_ok(url)
        return url
    return "compactor running (no metrics port to ask)"


def main(argv: list[str]) -> int:
    command, config_path = parse(argv if argv else command_line())
    try:
        said = check(command, config_path)
    except Exception as e:  # any failure is "unhealthy", said in one line
        print(f"neve {command} unhealthy: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"neve {command} healthy: {said}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

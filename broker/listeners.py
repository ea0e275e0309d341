"""The broker's Kafka listeners, read from its settings as Kafka writes them: each a name, a
security protocol, the address it binds and the address clients are told (per listener, so a
client inside a cluster and one outside each get an address they can reach)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from auth.session import PROTOCOLS

from .config import BrokerConfig
from .connection_limits import parse_overrides


class ListenerError(ValueError):
    """Listener settings that cannot be used; the message says which and why."""


@dataclass(frozen=True)
class Listener:
    name: str
    protocol: str  # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    host: str
    port: int  # 0: any free port, until the listener is bound
    advertised_host: str
    advertised_port: int = 0  # 0: the bound port

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")


def _endpoints(text: str, what: str) -> list[tuple[str, str, int]]:
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, address = item.partition("://")
        host, colon, port = address.rpartition(":")
        if not sep or not colon or not name or not port.isdigit():
            raise ListenerError(f"{what}: {item!r} is not NAME://host:port")
        out.append((name.upper(), host.strip("[]"), int(port)))
    names = [n for n, _, _ in out]
    if len(set(names)) != len(names):
        raise ListenerError(f"{what}: a listener name appears twice in {text!r}")
    return out


def _protocols(text: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, protocol = item.partition(":")
        if not sep or protocol.upper() not in PROTOCOLS:
            raise ListenerError(f"listener security protocol map: {item!r} is not NAME:PROTOCOL with PROTOCOL one of {', '.join(PROTOCOLS)}")
        out[name.strip().upper()] = protocol.upper()
    return out


def listeners_of(settings: BrokerConfig) -> list[Listener]:
    """Every listener of the broker, the first one the default (relays between brokers go to
    `inter_broker_listener_name`, else to it). Raises ListenerError."""
    protocols = _protocols(settings.listener_security_protocol_map)
    bound = _endpoints(settings.listeners, "listeners") or [("PLAINTEXT", settings.host, settings.port)]
    advertised = {name: (host, port) for name, host, port in _endpoints(settings.advertised_listeners, "advertised listeners")}
    unknown = set(advertised) - {name for name, _, _ in bound}
    if unknown:
        raise ListenerError(f"advertised listeners name no listener: {', '.join(sorted(unknown))}")
    out = []
    for name, host, port in bound:
        protocol = protocols.get(name, name if name in PROTOCOLS else "")
        if not protocol:
            raise ListenerError(f"listener {name}: not a security protocol, and not in the listener security protocol map")
        ad_host, ad_port = advertised.get(name, (settings.advertised_host or (host if host not in ("", "0.0.0.0", "::") else settings.advertised()), 0))
        out.append(Listener(name, protocol, host or "0.0.0.0", port, ad_host, ad_port))
    return out


def is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listeners(listeners: list[Listener], settings: BrokerConfig, cluster: bool = True) -> None:
    """Refuse what would expose a broker without meaning to: a cluster's PLAINTEXT listener off
    loopback (unless allow_insecure_listeners; `neve dev`, one machine's product, may bind one,
    in a container say), TLS without its files, SASL without a mechanism; and connection bounds
    that do not parse."""
    try:
        parse_overrides(settings.max_connections_per_ip_overrides)
    except ValueError as e:
        raise ListenerError(str(e)) from None
    for listener in listeners:
        if cluster and listener.protocol == "PLAINTEXT" and not is_loopback(listener.host) and not settings.allow_insecure_listeners:
            raise ListenerError(
                f"listener {listener.name} is PLAINTEXT (no authentication, no encryption) on {listener.host}, not loopback: "
                "use SSL or SASL_SSL, or set NEVE_BROKER_ALLOW_INSECURE_LISTENERS=true to accept it"
            )
        if listener.uses_tls and not (settings.ssl_certfile and settings.ssl_keyfile):
            raise ListenerError(f"listener {listener.name} is {listener.protocol}: set broker.ssl_certfile and broker.ssl_keyfile")
        if listener.uses_sasl and not [m for m in settings.sasl_enabled_mechanisms.split(",") if m.strip()]:
            raise ListenerError(f"listener {listener.name} is {listener.protocol}: broker.sasl_enabled_mechanisms is empty")
    names = {item.name for item in listeners}
    if settings.inter_broker_listener_name and settings.inter_broker_listener_name.upper() not in names:
        raise ListenerError(f"inter broker listener {settings.inter_broker_listener_name}: no such listener")
    inter = next((item for item in listeners if item.name == settings.inter_broker_listener_name.upper()), listeners[0])
    if cluster and inter.uses_sasl and not (settings.inter_broker_sasl_username and settings.inter_broker_sasl_password):
        raise ListenerError(
            f"brokers reach each other on {inter.name} ({inter.protocol}): set broker.inter_broker_sasl_username and "
            "inter_broker_sasl_password (a super user), or broker.inter_broker_listener_name"
        )

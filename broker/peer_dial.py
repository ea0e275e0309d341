"""How a broker dials another broker's Kafka listener (relayed group requests, forwarding.py):
the inter-broker listener's address, TLS when that listener is SSL or SASL_SSL, and a SASL
authentication as the broker's own user when it is SASL_*. The relaying broker's user must be a
super user where the authorizer is on: the coordinator then trusts the principal a relayed
request says its client authenticated as."""

from __future__ import annotations

import asyncio
import io
import ssl
import struct
from dataclasses import dataclass

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from scramp import ScramClient

from auth.tls import client_context

from .config import BrokerConfig
from .listeners import Listener

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
_SIZE = struct.Struct(">i")
CLIENT_ID = "neve-broker"


class PeerAuthenticationFailed(ConnectionError):
    """The other broker refused this broker's SASL authentication (a link failure: relays answer
    COORDINATOR_NOT_AVAILABLE and the client looks its coordinator up again)."""


@dataclass(frozen=True)
class PeerDialer:
    listener: str = ""  # the inter-broker listener's name; "": each broker's first listener
    tls: ssl.SSLContext | None = None
    mechanism: str = ""  # "": no SASL
    username: str = ""
    password: str = ""

    def endpoint(self, broker) -> tuple[str, int]:
        return broker.endpoint(self.listener) if self.listener else (broker.host, broker.port)

    async def open(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(host, port, ssl=self.tls, server_hostname=host if self.tls is not None else None)
        if self.mechanism:
            try:
                await self._authenticate(reader, writer)
            except BaseException:
                writer.close()
                raise
        return reader, writer

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handshake = await _call(reader, writer, SASL_HANDSHAKE, 1, 1, mechanism=self.mechanism)
        if handshake.error_code != ErrorCode.none:
            raise PeerAuthenticationFailed(f"SASL handshake {self.mechanism}: {handshake.error_code.name} (offered: {', '.join(handshake.mechanisms)})")
        if self.mechanism == "PLAIN":
            await self._step(reader, writer, 2, f"\0{self.username}\0{self.password}".encode())
            return
        client = ScramClient([self.mechanism], self.username, self.password)
        server_first = await self._step(reader, writer, 2, client.get_client_first().encode())
        client.set_server_first(server_first.decode())
        server_final = await self._step(reader, writer, 3, client.get_client_final().encode())
        try:
            client.set_server_final(server_final.decode())  # the other broker proves it holds the credential too
        except Exception as e:
            raise PeerAuthenticationFailed(f"SASL {self.mechanism}: the other broker's proof: {e}") from None

    async def _step(self, reader, writer, correlation_id: int, auth_bytes: bytes) -> bytes:
        answer = await _call(reader, writer, SASL_AUTHENTICATE, 2, correlation_id, auth_bytes=auth_bytes)
        if answer.error_code != ErrorCode.none:
            raise PeerAuthenticationFailed(f"SASL {self.mechanism} as {self.username}: {answer.error_code.name}: {answer.error_message}")
        return bytes(answer.auth_bytes)


async def _call(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, api_key: int, version: int, correlation_id: int, **fields):
    request = load_request_schema(api_key, version)
    header = request.__header_schema__(request_api_key=api_key, request_api_version=version, correlation_id=correlation_id, client_id=CLIENT_ID)
    out = io.BytesIO()
    entity_writer(request.__header_schema__)(out, header)
    entity_writer(request)(out, request(**fields))
    frame = out.getvalue()
    writer.write(_SIZE.pack(len(frame)) + frame)
    await writer.drain()
    (size,) = _SIZE.unpack(await reader.readexactly(4))
    answer = await reader.readexactly(size)
    response = load_response_schema(api_key, version)
    _, used = entity_reader(response.__header_schema__)(answer, 0)
    body, _ = entity_reader(response)(answer, used)
    return body


def peer_dialer(settings: BrokerConfig, listeners: list[Listener]) -> PeerDialer:
    """The dialer the settings describe: the inter-broker listener (else the first), with its TLS
    and, on a SASL listener, the broker's own user (SCRAM-SHA-512 when offered, else SCRAM-SHA-256,
    else PLAIN)."""
    name = settings.inter_broker_listener_name.upper()
    listener = next((item for item in listeners if item.name == name), listeners[0])
    tls = None
    if listener.uses_tls:
        tls = client_context(settings.ssl_cafile, settings.ssl_certfile if settings.ssl_client_auth != "none" else "", settings.ssl_keyfile)
    mechanism = ""
    if listener.uses_sasl:
        offered = [m.strip().upper() for m in settings.sasl_enabled_mechanisms.split(",")]
        mechanism = next((m for m in ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN") if m in offered), "")
    return PeerDialer(name if len(listeners) > 1 else "", tls, mechanism, settings.inter_broker_sasl_username, settings.inter_broker_sasl_password)

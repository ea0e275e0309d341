"""How the store reaches etcd securely: the settings an etcd:// URL's query gives (TLS files, a
user and the file holding its password), and aetcd's client over a TLS channel that logs in
again when etcd has forgotten its token."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

import aetcd
import grpc
from aetcd import rpc, watcher

log = logging.getLogger("neve.metadata.etcd")

# The query parameters of an etcd:// URL, each a meaning (documented in load_metadata_store).
QUERY_KEYS = ("tls", "ca", "cert", "key", "user", "password_file")
# etcd's answer to a token it does not know: a simple token unused for --auth-token-ttl, a JWT
# past its expiry, or any token after etcd restarted (simple tokens live in its memory).
INVALID_TOKEN = "invalid auth token"


@dataclass(frozen=True)
class EtcdSecurity:
    """TLS and authentication towards etcd. TLS is on with `tls` or any file of it: the server
    is checked against `ca_file` (the system's authorities if None), and `cert_file` with
    `key_file` is the client certificate shown when etcd asks for one. With `user`, the store
    logs in with the password in `password_file` (read at each login, so a rotated secret is
    taken up); without it, etcd with auth enabled takes the client certificate's common name."""

    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    user: str | None = None
    password_file: str | None = None

    @classmethod
    def from_query(cls, query: dict[str, str]) -> EtcdSecurity:
        if "password" in query:
            raise ValueError("an etcd:// URL takes no password: give password_file, a file holding it")
        unknown = sorted(set(query) - set(QUERY_KEYS))
        if unknown:
            raise ValueError(f"unknown etcd:// URL parameter(s) {', '.join(unknown)} (known: {', '.join(QUERY_KEYS)})")
        tls = query.get("tls", "false").strip().lower()
        if tls not in ("true", "false"):
            raise ValueError(f"tls in an etcd:// URL is true or false, not {query['tls']!r}")
        security = cls(tls == "true", query.get("ca"), query.get("cert"), query.get("key"), query.get("user"), query.get("password_file"))
        if (security.cert_file is None) != (security.key_file is None):
            raise ValueError("an etcd:// URL's client certificate needs both cert= and key=")
        if security.user is not None and not security.password_file:
            raise ValueError(f"etcd user {security.user!r} needs password_file= (a file holding its password)")
        if security.password_file and security.user is None:
            raise ValueError("an etcd:// URL's password_file= needs user=")
        return security

    @property
    def uses_tls(self) -> bool:
        return self.tls or any((self.ca_file, self.cert_file, self.key_file))


def split_endpoints(netloc: str) -> list[tuple[str, int]]:
    """The members an etcd:// URL names: `h1:p1,h2:p2,...` (each port required, each host an
    IPv4 address: gRPC balances over a list of addresses, not of names)."""
    endpoints = []
    for item in netloc.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not port.isdigit() or not _is_ipv4(host):
            raise ValueError(f"etcd endpoint {item!r} in {netloc!r}: several members are each ipv4-address:port")
        endpoints.append((host, int(port)))
    return endpoints


def _is_ipv4(host: str) -> bool:
    import ipaddress

    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv4Address)
    except ValueError:
        return False


def grpc_target(host: str, port: int) -> str:
    """gRPC's target for `host` (one member, `port` its port) or for several members
    (`host` is `h1:p1,h2:p2,...`, `port` unused): gRPC's `ipv4:` list, over which its channel
    picks one reachable member and moves to another when that one's connection fails."""
    if "," not in host:
        return f"{host}:{port}"
    return "ipv4:" + ",".join(f"{h}:{p}" for h, p in split_endpoints(host))


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"etcd {what} {path}: {e.strerror or e}") from None


def token_expired(error: BaseException) -> bool:
    return isinstance(error, grpc.aio.AioRpcError) and error.code() == grpc.StatusCode.UNAUTHENTICATED and INVALID_TOKEN in (error.details() or "")


class EtcdClient(aetcd.Client):
    """aetcd's client with what it lacks: a TLS channel, and a login again when etcd rejects the
    token (aetcd logs in once, at connect, and would fail every request from then on). Every
    request made with `metadata` (aetcd's own and the store's direct stub calls alike) goes
    through `_LoginAgain` when a user is set; streams (the watch, lease keep-alives) take the
    token current when they open."""

    def __init__(self, host: str, port: int, security: EtcdSecurity, *, timeout: float, options: dict) -> None:
        super().__init__(host=host, port=port, timeout=timeout, options=options)
        self.security = security
        self.logins = 0  # successful logins: the first, and one per token etcd forgot
        self._login_lock = asyncio.Lock()

    async def connect(self) -> None:
        # aetcd's connect but for the channel (it makes an insecure one) and the login
        if self._connected.is_set():
            return
        if self._is_connecting:
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        self._is_connecting = True
        try:
            self.channel = await self._open_channel()
            self.auth_stub = rpc.AuthStub(self.channel)
            if self.security.user is not None:
                await self._login()
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = watcher.Watcher(rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata)
            self._connected.set()
        finally:
            self._is_connecting = False

    async def _open_channel(self):
        target, options = grpc_target(self._host, self._port), list(self._options.items())
        interceptors = [_LoginAgain(self)] if self.security.user is not None else None
        if not self.security.uses_tls:
            return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
        s = self.security
        root, key, chain = await asyncio.to_thread(
            lambda: (
                _read(s.ca_file, "CA file") if s.ca_file else None,
                _read(s.key_file, "client key") if s.key_file else None,
                _read(s.cert_file, "client certificate") if s.cert_file else None,
            )
        )
        credentials = grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=chain)
        return grpc.aio.secure_channel(target, credentials, options=options, interceptors=interceptors)

    async def _login(self) -> None:
        password = (await asyncio.to_thread(_read, self.security.password_file, "password file")).decode().strip()
        request = rpc.AuthenticateRequest(name=self.security.user, password=password)
        reply = await self.auth_stub.Authenticate(request, timeout=self._timeout)
        self.metadata = (("token", reply.token),)
        self.logins += 1

    async def login_again(self, rejected: str | None) -> tuple:
        """Log in again unless another request already did since `rejected` was the token;
        returns the metadata to send from now on."""
        async with self._login_lock:
            if self._token() == rejected:
                log.info("etcd_login_again", extra={"user": self.security.user})
                await self._login()
            return self.metadata

    def _token(self) -> str | None:
        return dict(self.metadata or ()).get("token")


class _LoginAgain(grpc.aio.UnaryUnaryClientInterceptor):
    """A request etcd refuses for its token is sent again, once, after a new login."""

    def __init__(self, client: EtcdClient) -> None:
        self._client = client

    async def intercept_unary_unary(self, continuation, details, request):
        call = await continuation(details, request)
        sent = dict(details.metadata or ()).get("token")
        if sent is None:  # the login itself, or a request made before it: no token to renew
            return call
        try:
            return await call
        except grpc.aio.AioRpcError as e:
            if not token_expired(e):
                raise
        fresh = await self._client.login_again(sent)
        metadata = grpc.aio.Metadata(*[(k, v) for k, v in details.metadata if k != "token"], *fresh)
        return await (await continuation(details._replace(metadata=metadata), request))


def connect_failure(error: BaseException, security: EtcdSecurity) -> str:
    """Why the first requests to etcd failed, in words an operator acts on."""
    cause = error
    while cause is not None and not isinstance(cause, grpc.aio.AioRpcError | ValueError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, ValueError):
        return str(cause)
    if not isinstance(cause, grpc.aio.AioRpcError):
        return f"unreachable: {error!r}"
    details = cause.details() or cause.code().name
    if "authentication failed" in details:
        return f"refused the login of user {security.user!r}: {details}"
    if cause.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return f"refused the request: {details}"
    over = "over TLS" if security.uses_tls else "without TLS"
    return f"unreachable {over} ({cause.code().name}): {details}"

"""The schema registry's settings, declared once: neve's config loads them as its [registry]
section (NEVE_REGISTRY_<FIELD>)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PORT = 8081  # Confluent Schema Registry's


@dataclass
class RegistryConfig:
    port: int = -1
    """Schema registry (Confluent's REST API) port; 0: not served. -1 (the default): 8081 in
    `neve dev` (if 8081 is taken, dev runs without it and says so), not served by `neve broker`;
    `neve registry` serves it on 8081."""
    host: str = ""
    """Address the registry listens on; empty: the broker's `host`."""
    url: str = ""
    """An external schema registry (Confluent, Karapace, Apicurio) neve uses instead of its own:
    when set, no node serves one and schemas are looked up there (client.py)."""
    cache_size: int = 10_000
    """Schemas by id kept by a lookup client (they never change)."""

    # Serving over TLS (access.py's module doc says who may do what once users are set)
    tls_cert_file: str = ""
    """PEM certificate (with its chain) the registry serves HTTPS with, together with
    `tls_key_file`. Empty: plain HTTP."""
    tls_key_file: str = ""
    """PEM private key of `tls_cert_file`."""
    tls_client_ca_file: str = ""
    """PEM CA certificates a client's certificate must be signed by: when set, every client
    presents one (Confluent's ssl.client.authentication=REQUIRED). Empty: no client certificates."""

    # HTTP Basic authentication (Confluent's authentication.method=BASIC)
    users_file: str = ""
    """Users and their roles, one `user: password,role,...` a line (Jetty's property-file format,
    as Confluent's registry reads it; plain-text passwords only). Roles: read, write, admin,
    prefix:<subject prefix>. Read at start. Empty: no users file."""
    scram_users: bool = False
    """Also accept the brokers' SCRAM users (the metadata store's credentials) with their Kafka
    password; a user the users file names is checked there instead. Needs the registry to run in a
    broker (or beside the cluster's metadata store)."""
    scram_roles: str = "read"
    """Roles of a SCRAM user, as in the users file (e.g. "write,prefix:orders-")."""
    anonymous: str = ""
    """Roles of a request without credentials (e.g. "read"); "none": refused with 401. Empty (the
    default): refused once users come from `users_file` or `scram_users`, every role when neither
    is set (the registry open to whoever reaches it)."""

    # Looking schemas up in the registry at `url` (the compactor's reads)
    basic_auth_user_info: str = ""
    """`user:password` sent with HTTP Basic auth to the registry at `url`, as Confluent's
    basic.auth.user.info. Empty: no credentials."""
    url_ca_file: str = ""
    """PEM CA certificates that sign the certificate of an https `url`. Empty: the system's CAs."""

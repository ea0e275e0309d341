"""The settings the registry package reads (neve's [registry] section fills them in)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PORT = 8081  # Confluent Schema Registry's


@dataclass(frozen=True)
class RegistrySettings:
    host: str = "127.0.0.1"
    """Address the REST API listens on."""
    port: int = DEFAULT_PORT
    """Its port; 0: not served."""
    url: str = ""
    """An external registry (Confluent, Karapace, Apicurio) to use instead: when set, neve serves
    none and looks schemas up there (client.py)."""
    cache_size: int = 10_000
    """Schemas by id kept by a lookup client (they never change)."""

    @property
    def serves(self) -> bool:
        return self.port > 0 and not self.url

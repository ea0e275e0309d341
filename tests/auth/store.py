"""The metadata store the auth tests keep credentials in."""

from __future__ import annotations

from collections.abc import Mapping


class SecurityFamily:
    """The security family's three calls, in memory (stands in until the metadata store has them)."""

    def __init__(self) -> None:
        self.items: dict[str, bytes] = {}
        self.version = 0
        self.writes = 0

    def security_items(self, prefix: str) -> dict[str, bytes]:
        return {k: v for k, v in self.items.items() if k.startswith(prefix)}

    async def security_write(self, writes: Mapping[str, bytes | None]) -> None:
        for k, v in writes.items():
            if v is None:
                self.items.pop(k, None)
            else:
                self.items[k] = v
        self.version += 1
        self.writes += 1

    def security_version(self) -> int:
        return self.version


def security_store():
    return SecurityFamily()

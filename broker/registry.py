"""The handler registry: each handler module registers its API key and the version range it
implements, and ApiVersions answers from this registry, so what is advertised is what exists."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Handler:
    api_key: int
    name: str
    min_version: int
    max_version: int
    fn: Callable[[Any, Any], Awaitable[Any]]  # a coroutine function, or returns a future


HANDLERS: dict[int, Handler] = {}


def handles(api_key: int, name: str, min_version: int, max_version: int):
    """Register `async def fn(ctx, request) -> response | None` for these versions, or a plain
    `fn` returning an asyncio future of the response (Produce: no task per request). A handler
    answers None only when the protocol wants no response (Produce with acks=0)."""

    def register(fn):
        if api_key in HANDLERS:
            raise RuntimeError(f"api {api_key} registered twice")
        HANDLERS[api_key] = Handler(api_key, name, min_version, max_version, fn)
        return fn

    return register


def load_handlers() -> dict[int, Handler]:
    """Import every handler module so each registers itself."""
    import importlib
    import pkgutil

    from . import handlers

    for info in pkgutil.iter_modules(handlers.__path__):
        importlib.import_module(f"{handlers.__name__}.{info.name}")
    return HANDLERS

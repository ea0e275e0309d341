from __future__ import annotations

import pytest

from metadata.store import load_metadata_store


@pytest.fixture
async def store():
    """The metadata store credentials are kept in: the embedded one, in memory."""
    s = load_metadata_store("memory://")
    await s.start()
    yield s
    await s.close()

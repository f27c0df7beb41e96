"""Fixtures for the tests against the real redis-server (tests/conftest.py starts it)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.helpers.flavours import Flavour


@pytest.fixture(params=["sync", "asyncio"])
def flavour(request: pytest.FixtureRequest) -> Iterator[Flavour]:
    """Run the test once with the sync components and once with the asyncio ones."""
    made = Flavour(request.param)
    yield made
    made.close()


@pytest.fixture
def dead_redis_url() -> str:
    """A Redis URL nothing listens on (a port just freed): connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"

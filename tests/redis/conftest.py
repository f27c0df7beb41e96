"""Fixtures for the tests against the real redis-server (tests/conftest.py starts it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.flavours import Flavour


@pytest.fixture(params=["sync", "asyncio"])
def flavour(request: pytest.FixtureRequest) -> Iterator[Flavour]:
    """Run the test once with the sync components and once with the asyncio ones."""
    made = Flavour(request.param)
    yield made
    made.close()

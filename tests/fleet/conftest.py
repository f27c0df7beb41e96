"""Fixtures for tests that run real processes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def reap() -> Iterator[list[Any]]:
    """Processes registered here are killed at teardown if a test failed half-way."""
    started: list[Any] = []
    yield started
    for process in started:
        if process.is_alive():
            process.kill()
            process.join(5)

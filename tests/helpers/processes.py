"""Starting and reaping the real processes a fleet test runs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def collect(results: Any, count: int, timeout: float = 30.0) -> list[Any]:
    """`count` reports from a multiprocessing queue (each within `timeout`)."""
    return [results.get(timeout=timeout) for _ in range(count)]


def reap(processes: Iterable[Any], timeout: float = 30.0) -> None:
    """Join every process, killing those still alive after `timeout`."""
    processes = list(processes)
    for process in processes:
        process.join(timeout)
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(5)


def join_all(processes: list[Any]) -> None:
    """Reap the processes and check that each one exited cleanly."""
    reap(processes)
    assert [p.exitcode for p in processes] == [0] * len(processes)

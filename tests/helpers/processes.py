"""Starting and reaping the real processes a fleet test runs."""

from __future__ import annotations

import signal
from collections.abc import Iterable, Iterator
from typing import Any

from distbreaker.demo.embedded import RedisServer


def private_redis_server() -> Iterator[RedisServer]:
    """A private redis-server for a test that stops, freezes or kills it (a fixture body:
    `yield from`); resumed if a test left it SIGSTOPped, and stopped whatever it did."""
    srv = RedisServer().start()
    try:
        yield srv
    finally:
        if srv.process is not None and srv.process.poll() is None:
            srv.process.send_signal(signal.SIGCONT)
        srv.stop()


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

"""The bulkhead's limit shared by real (forked) processes, sync threads and asyncio tasks,
and the permits of SIGKILLed holders coming back within one lease."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import pytest

from distbreaker.bulkhead.aio import Bulkhead as AsyncBulkhead
from distbreaker.bulkhead.sync import Bulkhead
from distbreaker.errors import BulkheadFull

FORK = multiprocessing.get_context("fork")


def _thread_worker(url: str, name: str, threads: int, ready: Any, go: Any,
                   counters: Any, lock: Any) -> None:
    """One worker process: `threads` threads calling a 300 ms dependency at once."""
    bulkhead = Bulkhead(name, redis=url, max_concurrent_calls=3)
    bulkhead.metrics()  # connect before the start signal

    def dependency() -> None:
        with lock:
            counters[0] += 1                           # calls
            counters[1] += 1                           # running now
            counters[2] = max(counters[2], counters[1])  # peak
        time.sleep(0.3)
        with lock:
            counters[1] -= 1

    def one() -> None:
        go.wait()
        try:
            bulkhead.call(dependency)
            with lock:
                counters[3] += 1
        except BulkheadFull:
            with lock:
                counters[4] += 1

    workers = [threading.Thread(target=one) for _ in range(threads)]
    for worker in workers:
        worker.start()
    ready.release()
    for worker in workers:
        worker.join()


def _task_worker(url: str, name: str, tasks: int, ready: Any, go: Any,
                 counters: Any, lock: Any) -> None:
    """One worker process: `tasks` asyncio tasks calling a 300 ms dependency at once."""
    async def main() -> None:
        bulkhead = AsyncBulkhead(name, redis=url, max_concurrent_calls=3)
        await bulkhead.metrics()  # connect before the start signal

        async def dependency() -> None:
            with lock:
                counters[0] += 1
                counters[1] += 1
                counters[2] = max(counters[2], counters[1])
            await asyncio.sleep(0.3)
            with lock:
                counters[1] -= 1

        ready.release()
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        results = await asyncio.gather(*(bulkhead.call(dependency) for _ in range(tasks)),
                                       return_exceptions=True)
        with lock:
            counters[3] += sum(1 for r in results if r is None)
            counters[4] += sum(1 for r in results if isinstance(r, BulkheadFull))

    asyncio.run(main())


def run_four_processes(worker: Any, redis_url: str, name: str) -> list[int]:
    """Start 4 forked processes running 3+3+2+2 concurrent callers of `worker`, released
    together; return the shared counters [calls, running, peak, ok, full]."""
    ready, go, lock = FORK.Semaphore(0), FORK.Event(), FORK.Lock()
    counters = FORK.Array("i", 5, lock=False)
    processes = [FORK.Process(target=worker,
                              args=(redis_url, name, callers, ready, go, counters, lock))
                 for callers in (3, 3, 2, 2)]
    for process in processes:
        process.start()
    for _ in processes:
        assert ready.acquire(timeout=10)
    go.set()
    for process in processes:
        process.join(10)
        assert process.exitcode == 0
    return list(counters[:])


@pytest.mark.parametrize("worker", [_thread_worker, _task_worker], ids=["sync", "asyncio"])
def test_four_processes_share_the_limit(worker: Any, name: str, redis_url: str) -> None:
    calls, running, peak, ok, full = run_four_processes(worker, redis_url, name)
    assert (ok, full) == (3, 7)
    assert calls == 3 and peak == 3 and running == 0


def _hold_forever(bulkhead: Bulkhead, acquired: Any) -> None:
    bulkhead.acquire()
    acquired.release()
    time.sleep(60)


def test_sigkilled_holders_permits_come_back_within_one_lease(name: str, redis_url: str) -> None:
    # Created (and its renewal thread started) before the fork, like a preloaded app:
    # the children must renew their own permits after the fork.
    shared = Bulkhead(name, redis=redis_url, max_concurrent_calls=2, lease=1.0)
    shared.release(shared.acquire())
    acquired = FORK.Semaphore(0)
    holders = [FORK.Process(target=_hold_forever, args=(shared, acquired))
               for _ in range(2)]
    for process in holders:
        process.start()
    for _ in holders:
        assert acquired.acquire(timeout=10)
    bulkhead = Bulkhead(name, redis=redis_url, max_concurrent_calls=2, lease=1.0,
                        max_wait_duration=3.0)
    time.sleep(1.1)  # longer than the lease: the live holders renewed their permits
    assert bulkhead.metrics().in_use == 2
    for process in holders:
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        process.join(5)
    killed = time.monotonic()
    permits = [bulkhead.acquire(), bulkhead.acquire()]
    back_after = time.monotonic() - killed
    assert back_after <= 1.0 + 0.25
    assert bulkhead.metrics().in_use == 2
    for permit in permits:
        bulkhead.release(permit)

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
from tests.helpers.waiting import await_until, wait_until

FORK = multiprocessing.get_context("fork")
CALLERS = (3, 3, 2, 2)  # per process: 10 callers, a limit of 3


def everyone_tried(counters: Any) -> bool:
    """Every caller is in the dependency (calls) or was refused (full): a caller that a
    loaded machine started late cannot find a permit the first callers gave back."""
    return counters[0] + counters[4] >= sum(CALLERS)


def _thread_worker(url: str, name: str, threads: int, ready: Any, go: Any,
                   counters: Any, lock: Any) -> None:
    """One worker process: `threads` threads calling a dependency at once (it returns
    once every caller of the fleet has tried)."""
    bulkhead = Bulkhead(name, redis=url, max_concurrent_calls=3)
    bulkhead.metrics()  # connect before the start signal

    def dependency() -> None:
        with lock:
            counters[0] += 1                           # calls
            counters[1] += 1                           # running now
            counters[2] = max(counters[2], counters[1])  # peak
        wait_until(lambda: everyone_tried(counters), timeout=60, what="every caller tried")
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
    """One worker process: `tasks` asyncio tasks calling a dependency at once (it returns
    once every caller of the fleet has tried)."""
    async def main() -> None:
        bulkhead = AsyncBulkhead(name, redis=url, max_concurrent_calls=3)
        await bulkhead.metrics()  # connect before the start signal

        async def dependency() -> None:
            with lock:
                counters[0] += 1
                counters[1] += 1
                counters[2] = max(counters[2], counters[1])
            await await_until(lambda: everyone_tried(counters), timeout=60,
                              what="every caller tried")
            with lock:
                counters[1] -= 1

        async def one() -> None:
            try:
                await bulkhead.call(dependency)
                with lock:
                    counters[3] += 1
            except BulkheadFull:
                with lock:
                    counters[4] += 1

        ready.release()
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        await asyncio.gather(*(one() for _ in range(tasks)))

    asyncio.run(main())


def run_four_processes(worker: Any, redis_url: str, name: str) -> list[int]:
    """Start 4 forked processes running 3+3+2+2 concurrent callers of `worker`, released
    together; return the shared counters [calls, running, peak, ok, full]."""
    ready, go, lock = FORK.Semaphore(0), FORK.Event(), FORK.Lock()
    counters = FORK.Array("i", 5, lock=False)
    processes = [FORK.Process(target=worker,
                              args=(redis_url, name, callers, ready, go, counters, lock))
                 for callers in CALLERS]
    for process in processes:
        process.start()
    for _ in processes:
        assert ready.acquire(timeout=60)
    go.set()
    for process in processes:
        process.join(90)
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
    # the children must renew their own permits after the fork. (A 3 s lease, renewed
    # every second: a loaded machine still renews in time.)
    lease = 3.0
    shared = Bulkhead(name, redis=redis_url, max_concurrent_calls=2, lease=lease)
    shared.release(shared.acquire())
    acquired = FORK.Semaphore(0)
    holders = [FORK.Process(target=_hold_forever, args=(shared, acquired))
               for _ in range(2)]
    for process in holders:
        process.start()
    for _ in holders:
        assert acquired.acquire(timeout=60)
    bulkhead = Bulkhead(name, redis=redis_url, max_concurrent_calls=2, lease=lease,
                        max_wait_duration=60.0)
    time.sleep(lease + 0.3)  # longer than the lease: the live holders renewed their permits
    assert bulkhead.metrics().in_use == 2
    for process in holders:
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        process.join(20)
    killed = time.monotonic()
    # the dead holders' leases end (within one lease): their permits come back to a
    # waiter (waiting, not refused: the 60 s patience is far longer)
    permits = [bulkhead.acquire(), bulkhead.acquire()]
    back_after = time.monotonic() - killed
    print(f"\npermits back {back_after:.2f}s after the kill (lease {lease:g}s)")
    assert back_after < 60.0
    assert bulkhead.metrics().in_use == 2
    for permit in permits:
        bulkhead.release(permit)

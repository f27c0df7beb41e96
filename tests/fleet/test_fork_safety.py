"""Breakers, bulkheads and budgets made and used in a parent survive a fork.

gunicorn and Celery prefork create them before forking; each child must open
its own Redis connections, must not deadlock on a lock another parent thread
held at fork time, and must not resend what belongs to the parent.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import redis

from distbreaker import Bulkhead, CircuitBreaker, RetryBudget
from distbreaker._runtime import forking
from distbreaker.breaker.state import State
from distbreaker.errors import CallNotPermitted
from tests.helpers.budget_window import window
from tests.helpers.waiting import wait_until

CFG = {"sliding_window_size": 100, "minimum_number_of_calls": 40, "failure_rate_threshold": 50,
       "wait_duration_in_open_state": 30}
WORKERS = 4
CALLS = 10


class Parts:
    """What a web app builds at import time, before gunicorn forks."""

    def __init__(self, url: str, name: str) -> None:
        self.breaker = CircuitBreaker(name, redis=url, **CFG)
        self.bulkhead = Bulkhead(name, redis=url, max_concurrent_calls=WORKERS + 1, lease=0.6)
        self.budget = RetryBudget(name, redis=url, percent_can_retry=0.0,
                                  min_retries_per_sec=0.1, ttl=60, deposit_batch=10)
        self.transitions: list[Any] = []
        self.breaker.add_listener(self.transitions.append)

    def client_ids(self) -> dict[str, int]:
        """The server-side connection id each component's client uses now."""
        return {"breaker": self.breaker._client.client_id(),
                "bulkhead": self.bulkhead._client.client_id(),
                "budget": self.budget._client.client_id()}

    def work(self, fail: bool = False) -> dict[str, Any]:
        """CALLS protected calls, each holding a bulkhead permit long enough to be renewed once."""
        outcomes = []
        def call(first: bool) -> None:
            if first:
                time.sleep(0.3)  # > the renewal interval (lease / 3)
            if fail:
                raise ConnectionError("down")

        for i in range(CALLS):
            try:
                self.bulkhead.call(self.breaker.call, call, i == 0)
                outcomes.append("ok")
            except ConnectionError:
                outcomes.append("failed")
            except CallNotPermitted:
                outcomes.append("rejected")
        self.budget.deposit(CALLS // 2)
        return {"ids": self.client_ids(), "outcomes": outcomes, "pid": os.getpid(),
                "transitions": [(t.from_state.value, t.to_state.value)
                                for t in self.transitions]}


def _child(parts: Parts, fail: bool, queue: Any) -> None:
    result = parts.work(fail)
    parts.budget.flush()   # a worker's batched deposits, sent before it exits
    queue.put(result)


def _run_children(parts: Parts, fail: bool, use_mp: bool) -> list[dict[str, Any]]:
    """WORKERS children via multiprocessing's fork context, or bare os.fork()."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    if use_mp:
        procs = [ctx.Process(target=_child, args=(parts, fail, queue)) for _ in range(WORKERS)]
        for p in procs:
            p.start()
        results = [queue.get(timeout=30) for _ in procs]
        for p in procs:
            p.join(10)
            assert p.exitcode == 0
        return results
    pids = []
    for _ in range(WORKERS):
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without running pytest's cleanup
            code = 1
            try:
                _child(parts, fail, queue)
                queue.close()
                queue.join_thread()
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    results = [queue.get(timeout=30) for _ in pids]
    for pid in pids:
        assert os.waitpid(pid, 0)[1] == 0
    return results


@pytest.mark.parametrize("use_mp", [True, False], ids=["multiprocessing-fork", "os.fork"])
def test_children_share_the_breaker_but_no_connection(redis_url: str, redis_client: redis.Redis,
                                                      name: str, use_mp: bool) -> None:
    parts = Parts(redis_url, name)
    mine = parts.work()                 # the parent has live pooled connections now
    assert mine["outcomes"] == ["ok"] * CALLS
    assert parts.budget._pending_deposits == CALLS // 2    # batched deposits pending at fork time

    results = _run_children(parts, fail=False, use_mp=use_mp)

    assert all(r["outcomes"] == ["ok"] * CALLS for r in results)
    ids = [mine["ids"]] + [r["ids"] for r in results]
    # No server-side connection shared between processes (within one, the components
    # built from one URL share one pool).
    per_process = [set(per.values()) for per in ids]
    assert len(set().union(*per_process)) == sum(len(one) for one in per_process)
    assert len({r["pid"] for r in results}) == WORKERS
    # The fleet saw every call, in one breaker.
    assert parts.breaker.metrics().calls == CALLS * (WORKERS + 1)
    assert parts.bulkhead.metrics().in_use == 0
    assert parts.bulkhead._codec.lost_here == 0
    # Each child sent its own batched deposits, not the parent's pending ones as well.
    parts.budget.flush()
    stored = window(redis_client, parts.budget.keys.slices)
    deposits = sum(v for k, v in stored.items() if k.startswith("d:"))
    assert deposits == (WORKERS + 1) * (CALLS // 2)


def test_children_trip_the_shared_breaker_once(redis_url: str, name: str) -> None:
    parts = Parts(redis_url, name)
    parts.work()                                   # 10 successes
    results = _run_children(parts, fail=True, use_mp=True)   # 4 x 10 failures
    trips = [t for r in results for t in r["transitions"] if t == ("CLOSED", "OPEN")]
    assert len(trips) == 1                         # reported once, by the child that made it
    assert parts.breaker.state is State.OPEN
    assert any("rejected" in r["outcomes"] for r in results)


def _hold(locks: list[threading.Lock], holding: threading.Event, release: threading.Event) -> None:
    for lock in locks:
        lock.acquire()
    holding.set()
    release.wait()
    for lock in locks:
        lock.release()


def _fork_and_run(fn: Callable[[], None], timeout: float = 15.0) -> int:
    """Run fn in a bare os.fork() child; its exit status (killed after `timeout`)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fn()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    def exited() -> tuple[int, int] | None:
        done, status = os.waitpid(pid, os.WNOHANG)
        return (done, status) if done else None

    try:
        _, status = wait_until(exited, timeout=timeout, interval=0.02, what="the child exits")
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError("the child deadlocked") from None
    return os.waitstatus_to_exitcode(status)


def test_lock_held_by_another_thread_at_fork_does_not_deadlock_the_child(
        redis_url: str, name: str) -> None:
    parts = Parts(redis_url, name)
    parts.work()
    b, h, r = parts.breaker, parts.bulkhead, parts.budget
    held = [b._codec._lock, b._listeners._lock, h._lock, h._codec._lock, r._pending_lock,
            b._health._lock]
    holding, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold, args=(held, holding, release), daemon=True)
    holder.start()
    assert holding.wait(5)

    def child() -> None:
        assert all(lock.locked() for lock in held)   # the parent's locks stay held here
        for _ in range(4):                              # records, a transition, rejections
            work = parts.work(fail=True)
        assert "rejected" in work["outcomes"]
        assert ("CLOSED", "OPEN") in work["transitions"]
        parts.bulkhead._waiter()                        # takes the bulkhead's own lock
        parts.budget.flush()
        assert b._codec.not_permitted >= 1
        fresh = b._codec._lock
        forking.after_fork()                            # explicit hook: a no-op now
        assert b._codec._lock is fresh

    try:
        assert _fork_and_run(child) == 0
    finally:
        release.set()
        holder.join(5)


def test_explicit_hook_resets_when_the_fork_hooks_did_not_run(redis_url: str,
                                                              name: str) -> None:
    """A server forking from C (uWSGI without py-call-osafterfork) skips Python's
    fork hooks; calling the public distbreaker.after_fork() in its post-fork hook
    does the work."""
    import distbreaker

    assert distbreaker.after_fork is forking.after_fork
    parts = Parts(redis_url, name)
    parts.work()
    codec = parts.breaker._codec
    assert codec.outcomes["success"] == CALLS
    before = codec._lock
    forking._handled_pid = -1          # as if this process were a child the hooks missed
    distbreaker.after_fork()
    assert codec._lock is not before and codec.outcomes["success"] == 0
    assert forking._handled_pid == os.getpid()
    again = codec._lock
    distbreaker.after_fork()
    assert codec._lock is again        # idempotent in the same process


def test_ganesha_members_stay_unique_across_a_fork(redis_url: str, name: str) -> None:
    """Ganesha mode tags its ZSET members per process; a child must not reuse the
    parent's tag (both continue the same counter, so members could collide)."""
    from distbreaker.ganesha.sync import GaneshaBreaker

    breaker = GaneshaBreaker(name, redis=redis_url)
    parent_tag = breaker._codec._process_tag
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=lambda: queue.put(breaker._codec._process_tag))
    proc.start()
    child_tag = queue.get(timeout=20)
    proc.join(10)
    assert child_tag != parent_tag

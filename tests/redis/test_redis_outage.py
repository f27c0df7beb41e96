"""When Redis dies, hangs or forgets its scripts (principle 7: never become the outage).

Each test starts its own `RedisServer` so it can SIGKILL, SIGSTOP and restart
it on the same port; the fixture always resumes and stops it.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.connection
from redis.exceptions import ConnectionError as RedisConnectionError

from distbreaker import CircuitBreaker
from distbreaker._runtime.health import UNAVAILABLE_ERRORS
from distbreaker._runtime.scripts import FUNCTIONS, library
from distbreaker.breaker.events import Transition
from distbreaker.breaker.state import State
from distbreaker.demo.embedded import RedisServer
from distbreaker.errors import CallNotPermitted
from tests.helpers.dependency import SEED, Dependency, run_requests
from tests.helpers.dependency import outcome as call_outcome
from tests.helpers.flavours import Flavour
from tests.helpers.processes import private_redis_server
from tests.helpers.waiting import wait_until

TIMEOUT = 0.2
FAST = {"sliding_window_size": 10, "minimum_number_of_calls": 5, "failure_rate_threshold": 50,
        "wait_duration_in_open_state": 1.0, "redis_timeout": TIMEOUT,
        "redis_retry_max_backoff": 0.2}


class DependencyDown(Exception):
    pass


def dependency() -> Dependency:
    """Healthy until told otherwise; then it raises DependencyDown."""
    return Dependency(error=DependencyDown("dependency down"))


@pytest.fixture
def server() -> Iterator[RedisServer]:
    yield from private_redis_server()


def pause(srv: RedisServer, sig: signal.Signals) -> None:
    assert srv.process is not None
    os.kill(srv.process.pid, sig)


def outcome(breaker: CircuitBreaker, dep: Dependency) -> str:
    return call_outcome(lambda: breaker.call(dep), DependencyDown, with_state=True)


def wait_until_redis_used(breaker: CircuitBreaker, client: redis.Redis) -> None:
    """Call until a call is recorded in Redis again (the backoff has ended)."""
    def used() -> int:
        breaker.call(lambda: None)
        return client.exists(breaker.keys.state)

    wait_until(used, what="the breaker goes back to Redis")


def test_fail_open_calls_continue_and_the_local_breaker_still_opens(server: RedisServer,
                                                                    name: str) -> None:
    breaker = CircuitBreaker(name, redis=server.url, **FAST)
    events: list[Transition] = []
    breaker.add_listener(events.append)
    dep = dependency()
    assert breaker.call(dep) == "ok"
    server.kill()

    assert [outcome(breaker, dep) for _ in range(12)] == ["ok"] * 12
    dep.healthy = False
    # the local window holds 10 successes: the 5th failure makes it 50 %
    assert [outcome(breaker, dep) for _ in range(8)] == ["failed"] * 5 + ["rejected:OPEN"] * 3
    assert dep.calls == 1 + 12 + 5
    assert [(e.from_state, e.to_state, e.source) for e in events] == [
        (State.CLOSED, State.OPEN, "local")]
    with pytest.raises(RedisConnectionError):
        breaker.metrics()  # reads and operator actions go to Redis only


def test_a_dead_redis_is_retried_with_backoff_not_on_every_call(
        server: RedisServer, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[float] = []
    original = redis.connection.Connection._connect

    def counting_connect(self: Any) -> Any:
        if self.port == server.port:
            attempts.append(time.monotonic())
        return original(self)

    monkeypatch.setattr(redis.connection.Connection, "_connect", counting_connect)
    # (subscribe=False: the transitions subscriber's own reconnects, bounded by their own
    # backoff, are not protected calls and would add connection attempts of their own)
    breaker = CircuitBreaker(name, redis=server.url, **{**FAST, "redis_retry_max_backoff": 5.0,
                                                        "subscribe": False})
    assert breaker.call(lambda: "ok") == "ok"
    assert len(attempts) == 1
    server.kill()
    attempts.clear()

    threads, per_thread = 4, 100
    done: list[int] = []

    def hammer() -> None:
        done.append(sum(breaker.call(lambda: 1) for _ in range(per_thread)))

    started = time.monotonic()
    workers = [threading.Thread(target=hammer) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    elapsed = time.monotonic() - started

    assert done == [per_thread] * threads  # every call ran (on the local breaker)
    # Threads already past the health check when Redis died each find out once (<= 4
    # attempts, however long a loaded machine takes to run them); after that one trial
    # per backoff period (50 ms, doubling, jittered): a count that grows with the log of
    # the time the calls took, not one or two attempts per call.
    assert 1 <= len(attempts) <= threads + 2 + int(elapsed / 0.025).bit_length(), \
        (attempts, elapsed)
    assert len(attempts) < threads * per_thread / 20


def test_fail_closed_rejects_with_the_redis_error_as_cause(server: RedisServer,
                                                           name: str) -> None:
    config = {**FAST, "on_redis_error": "fail_closed"}
    breaker = CircuitBreaker(name, redis=server.url, **config)
    dep = dependency()
    assert breaker.call(dep) == "ok"
    server.kill()

    # The local view is CLOSED: the next call costs no round trip before it runs, so it
    # runs; its record fails quietly and from then on every call is rejected.
    assert breaker.call(dep) == "ok"
    for _ in range(5):
        with pytest.raises(CallNotPermitted) as rejected:
            breaker.call(dep)
        assert isinstance(rejected.value.__cause__, RedisConnectionError)
        assert "redis unavailable" in str(rejected.value)
    assert dep.calls == 2

    fresh = CircuitBreaker(name, redis=server.url, **config)  # no local view: asks first
    with pytest.raises(CallNotPermitted) as rejected:
        fresh.call(dep)
    assert isinstance(rejected.value.__cause__, RedisConnectionError)
    assert dep.calls == 2


def test_restarted_redis_is_used_again_and_shared_state_resumes(server: RedisServer,
                                                                name: str) -> None:
    breaker = CircuitBreaker(name, redis=server.url, **FAST)
    events: list[Transition] = []
    breaker.add_listener(events.append)
    dep = dependency()
    assert breaker.call(dep) == "ok"
    server.kill()
    assert [outcome(breaker, dep) for _ in range(5)] == ["ok"] * 5

    server.start()  # same port, empty (no persistence), no scripts cached
    client = redis.Redis.from_url(server.url)
    wait_until_redis_used(breaker, client)
    dep.healthy = False
    outcomes = [outcome(breaker, dep) for _ in range(10)]
    assert outcomes[-1] == "rejected:OPEN"
    assert events[-1].to_state is State.OPEN and events[-1].source == "redis"

    other = CircuitBreaker(name, redis=server.url, **FAST)  # a second worker
    assert other.state is State.OPEN
    with pytest.raises(CallNotPermitted):
        other.call(dep)
    client.close()


def test_a_hung_redis_costs_about_one_timeout_and_no_error(server: RedisServer,
                                                           name: str) -> None:
    config = {**FAST, "sliding_window_size": 100, "minimum_number_of_calls": 100}
    breaker = CircuitBreaker(name, redis=server.url, **config)
    dep = dependency()
    assert breaker.call(dep) == "ok"
    pause(server, signal.SIGSTOP)
    took: list[float] = []
    try:
        for _ in range(30):
            started = time.monotonic()
            assert breaker.call(dep) == "ok"
            took.append(time.monotonic() - started)
        fresh = CircuitBreaker(name, redis=server.url, **config)  # must ask Redis first
        started = time.monotonic()
        assert fresh.call(dep) == "ok"
        fresh_took = time.monotonic() - started
    finally:
        pause(server, signal.SIGCONT)
    # The first call waits out the timeout; later ones run on the local breaker while
    # the backoff lasts (a retrial after it may wait once more): bounded waits, not a
    # hang and not a timeout per call. (Generous bounds: how long a wait takes on a
    # loaded machine is not the point.)
    slow = [t for t in took if t >= TIMEOUT * 0.9]
    assert took[0] >= TIMEOUT * 0.9 and max(took) < 5.0, took
    assert len(slow) <= 10, took
    assert fresh_took < 5.0  # connect handshake + one script, each bounded

    before = breaker.metrics().calls

    def recorded_again() -> bool:
        assert breaker.call(dep) == "ok"
        return breaker.metrics().calls > before

    wait_until(recorded_again, what="calls are recorded in Redis again")


@pytest.mark.parametrize("form", ["function", "eval"])
def test_script_flush_mid_run_is_recovered(server: RedisServer, name: str, form: str) -> None:
    """FUNCTION FLUSH (the Function form) or SCRIPT FLUSH (the EVAL form) mid-run: every
    outcome still reaches Redis, which loads the code again."""
    client = redis.Redis.from_url(server.url)
    if form == "eval":
        FUNCTIONS.give_up(client, "test: the EVAL form")   # per client object
    breaker = CircuitBreaker(name, redis=client, **FAST)
    events: list[Transition] = []
    breaker.add_listener(events.append)
    dep = dependency()
    for _ in range(3):
        assert breaker.call(dep) == "ok"
    if form == "eval":
        client.script_flush()
    else:
        client.function_flush()
    dep.healthy = False
    # every outcome reaches Redis: 3 successes + 3 failures is 50 %, opened by Redis itself
    assert [outcome(breaker, dep) for _ in range(4)] == ["failed"] * 3 + ["rejected:OPEN"]
    assert breaker.state is State.OPEN
    assert [(e.to_state, e.source) for e in events] == [(State.OPEN, "redis")]
    if form == "eval":
        assert client.script_exists(breaker._script.sha) == [True]
    else:
        assert len(client.function_list(library().name)) == 1   # loaded again
    client.close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def test_unreachable_from_the_start_the_local_breaker_still_protects(flavour: Flavour) -> None:
    breaker = flavour.breaker("unreachable", redis=closed_port_url(), **SEED)
    events: list[Transition] = []
    breaker.add_listener(events.append)
    dep = Dependency(healthy=False)
    outcomes = run_requests(lambda: breaker.call(dep), 8)
    assert outcomes == ["failed"] * 5 + ["rejected"] * 3
    assert dep.calls == 5
    assert [(e.from_state, e.to_state, e.source) for e in events] == [
        (State.CLOSED, State.OPEN, "local")]
    with pytest.raises(RedisConnectionError):  # operator reads do raise
        breaker.get_state()


def test_unreachable_from_the_start_fail_closed_rejects_with_the_redis_error_as_cause(
        flavour: Flavour) -> None:
    breaker = flavour.breaker("unreachable", redis=closed_port_url(),
                              on_redis_error="fail_closed")
    dep = Dependency()
    with pytest.raises(CallNotPermitted) as caught:
        breaker.call(dep)
    assert isinstance(caught.value.__cause__, RedisConnectionError)
    assert dep.calls == 0


def test_busy_and_misconf_replies_count_as_unavailable() -> None:
    """A Redis that answers BUSY/MISCONF cannot serve us: fail open, never raise."""
    import hashlib

    from distbreaker._runtime.scripts import LuaScript, RedisBusyError, run_script

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        for reply in ("BUSY Redis is busy running a script", "MISCONF no disk"):
            source = f"return redis.error_reply('{reply}')"
            script = LuaScript("x", source, hashlib.sha1(source.encode()).hexdigest())
            with pytest.raises(RedisBusyError) as caught:
                run_script(client, script, [], [])
            assert caught.value.__cause__ is not None
            assert isinstance(caught.value, UNAVAILABLE_ERRORS)
        client.close()


def test_fallback_runtime_loads_in_the_background_without_blocking_calls() -> None:
    """A fresh process whose Redis is down does not wait for fakeredis to load."""
    import subprocess
    import sys
    import textwrap

    from distbreaker.demo.embedded import free_port

    code = textwrap.dedent(f"""
        import importlib.abc, sys, threading, time
        from distbreaker import CircuitBreaker, CallNotPermitted
        from distbreaker._runtime.local import LOCAL_RUNTIME
        assert "fakeredis" not in sys.modules

        loading_may_end = threading.Event()

        class HoldFakeredis(importlib.abc.MetaPathFinder):
            # the fallback runtime's import waits until the first call is done
            def find_spec(self, name, path, target=None):
                if name == "fakeredis":
                    loading_may_end.wait(600)  # (a call waiting for it hangs the test)
                return None

        sys.meta_path.insert(0, HoldFakeredis())
        breaker = CircuitBreaker("cold", redis="redis://127.0.0.1:{free_port()}/0",
                                 sliding_window_size=4, minimum_number_of_calls=4)
        assert breaker.call(lambda: "ok") == "ok"      # passes while the runtime loads
        assert not LOCAL_RUNTIME.wait(0)
        loading_may_end.set()
        assert LOCAL_RUNTIME.wait(30)
        outcomes = []
        for _ in range(6):
            time.sleep(0.01)
            try:
                breaker.call(lambda: 1 / 0)
            except ZeroDivisionError:
                outcomes.append("failed")
            except CallNotPermitted:
                outcomes.append("rejected")
        print(outcomes)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    # the local breaker protects once loaded, and the call passed while it loaded was
    # recorded there: 1 success + 3 failures (75 % of the minimum 4) open it
    assert done.stdout.strip() == str(["failed"] * 3 + ["rejected"] * 3)

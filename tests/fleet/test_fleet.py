"""One breaker shared by a fleet of real processes (multiprocessing, spawn and fork).

Worker bodies live in tests/helpers/fleet_worker.py. Every worker builds its own
`CircuitBreaker` on the shared Redis URL, except in the fork tests, where the
children use the object their parent created.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from typing import Any

import pytest
import redis

from distbreaker import CircuitBreaker
from distbreaker.breaker.state import State
from distbreaker.errors import CallNotPermitted
from tests.helpers import fleet_worker
from tests.helpers.fleet_worker import counter_key, wait_for_count
from tests.helpers.processes import collect, join_all
from tests.helpers.stampede import half_open_stampede
from tests.helpers.waiting import wait_until

SPAWN = multiprocessing.get_context("spawn")
FORK = multiprocessing.get_context("fork")
PROCESSES = 4


def test_all_processes_see_open_after_one_trips_it(name: str, redis_url: str,
                                                   redis_client: redis.Redis,
                                                   reap: list[Any]) -> None:
    cfg = {"sliding_window_size": 4, "minimum_number_of_calls": 4,
           "wait_duration_in_open_state": 30.0}
    tripped = SPAWN.Event()
    results = SPAWN.Queue()
    workers = [SPAWN.Process(target=fleet_worker.see_open_then_call,
                             args=(redis_url, name, cfg, i, tripped, results))
               for i in range(PROCESSES)]
    reap.extend(workers)
    for worker in workers:
        worker.start()
    reports = sorted(collect(results, PROCESSES), key=lambda r: r["index"])
    join_all(workers)

    assert reports[0]["failures"] == 2  # 2 of the 4 calls in the window: 50 %
    for report in reports[1:]:
        assert report["state"] == "OPEN"
        assert len(report["rejected"]) == 5
        assert all(state == "OPEN" and 29 < wait <= 30 for state, wait in report["rejected"])
        assert report["reached"] == 0
    assert CircuitBreaker(name, redis=redis_url, **cfg).state is State.OPEN


def test_half_open_admits_only_the_permitted_probes_fleet_wide(
        name: str, redis_url: str, redis_client: redis.Redis) -> None:
    cfg = {"wait_duration_in_open_state": 0.4, "permitted_calls_in_half_open": 3,
           "half_open_lease": 20.0}
    run = half_open_stampede(redis_url, redis_client, name, cfg, PROCESSES, threads=4)
    assert run.exitcodes == [0] * PROCESSES
    # every thread of the fleet had tried while the probes were still in flight
    assert run.probes_in_flight == 3
    assert (run.reached, run.rejected) == (3, run.total - 3)
    assert sorted(run.outcomes) == ["ok"] * 3 + ["rejected:HALF_OPEN"] * (run.total - 3)
    assert run.breaker.state is State.CLOSED  # the three probes succeeded


def test_exactly_one_open_transition_while_the_fleet_fails_together(
        name: str, redis_url: str, redis_client: redis.Redis, reap: list[Any]) -> None:
    threads, calls = 3, 8
    cfg = {"sliding_window_size": 10, "minimum_number_of_calls": 5,
           "wait_duration_in_open_state": 30.0}
    keys = CircuitBreaker(name, redis=redis_url, **cfg).keys
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.channel)
    go = SPAWN.Event()
    results = SPAWN.Queue()
    workers = [SPAWN.Process(target=fleet_worker.fail_together,
                             args=(redis_url, name, cfg, threads, calls, go, results))
               for _ in range(PROCESSES)]
    reap.extend(workers)
    for worker in workers:
        worker.start()
    assert wait_for_count(redis_client, counter_key(name, "ready"), PROCESSES) == PROCESSES
    go.set()
    reports = collect(results, PROCESSES)
    join_all(workers)

    messages = [json.loads(wait_until(lambda: pubsub.get_message(timeout=0.05),
                                      what="a transition is published")["data"])]
    while (message := pubsub.get_message(timeout=0.2)) is not None:  # and any others
        messages.append(json.loads(message["data"]))
    pubsub.close()
    history = redis_client.xrange(keys.history)

    assert sum(r["failed"] + r["rejected"] for r in reports) == PROCESSES * threads * calls
    assert sum(r["failed"] for r in reports) >= 5
    heard = [event for report in reports for event in report["opened"]]
    assert heard == [("CLOSED", "redis")]
    mine = [m for m in messages if m["name"] == name]
    assert [(m["from"], m["to"]) for m in mine] == [("CLOSED", "OPEN")]
    assert [(e[b"from"], e[b"to"]) for _, e in history] == [(b"CLOSED", b"OPEN")]


def test_sigkilled_probe_holder_blocks_only_until_its_lease_ends(
        name: str, redis_url: str, redis_client: redis.Redis, reap: list[Any]) -> None:
    """The dead holder's probe slot frees up when its lease ends (server time), not
    before and not never. Judged by the server's clock around each attempt, so a slow
    machine cannot make it pass or fail. The lease is long enough (8 s) to outlast a
    spawn, a SIGKILL and a join on a loaded machine, so it is still held when checked."""
    lease = 8.0
    cfg = {"wait_duration_in_open_state": 0.2, "permitted_calls_in_half_open": 1,
           "half_open_lease": lease}
    breaker = CircuitBreaker(name, redis=redis_url, **cfg)
    breaker.trip()
    time.sleep(0.25)
    assert breaker.state is State.HALF_OPEN
    in_call = SPAWN.Event()
    holder = SPAWN.Process(target=fleet_worker.hang_in_probe,
                           args=(redis_url, name, cfg, in_call))
    reap.append(holder)
    holder.start()
    assert in_call.wait(60)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(20)
    assert holder.exitcode == -signal.SIGKILL
    assert breaker.metrics().probes_in_flight == 1
    (_, lease_ends_ms), = redis_client.zrange(breaker.keys.probes, 0, -1, withscores=True)

    def server_ms() -> int:
        seconds, micros = redis_client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    if server_ms() < lease_ends_ms:  # (a very slow machine may be past it already)
        with pytest.raises(CallNotPermitted) as rejected:
            breaker.call(lambda: "ok")
        assert rejected.value.state is State.HALF_OPEN
        assert 0 <= rejected.value.retry_after <= lease

    def permitted() -> bool:
        before = server_ms()
        try:
            assert breaker.call(lambda: "ok") == "ok"
        except CallNotPermitted:
            assert before <= lease_ends_ms + 50, "rejected after the dead holder's lease ended"
            return False
        assert server_ms() >= lease_ends_ms, "permitted before the dead holder's lease ended"
        return True

    wait_until(permitted, what="a call is permitted once the dead holder's lease ended")
    assert breaker.state is State.CLOSED


def _named_clients(client: redis.Redis, client_name: str) -> list[dict[str, Any]]:
    return [c for c in client.client_list() if c.get("name") == client_name]


def test_breaker_created_before_fork_gets_new_connections_in_children(
        name: str, redis_url: str, redis_client: redis.Redis, reap: list[Any]) -> None:
    cfg = {"sliding_window_size": 100, "minimum_number_of_calls": 100}
    client_name = f"fork-{name}"  # tells this test's connections apart in CLIENT LIST
    breaker = CircuitBreaker(name, redis=f"{redis_url}?client_name={client_name}", **cfg)
    assert breaker.call(lambda: "ok") == "ok"  # the parent's pool holds a connection
    assert breaker.metrics().calls == 1
    parent_clients = _named_clients(redis_client, client_name)
    assert len(parent_clients) == 1

    hold = FORK.Event()
    results = FORK.Queue()
    children = [FORK.Process(target=fleet_worker.use_inherited_breaker,
                             args=(breaker, redis_url, i, hold, results))
                for i in range(PROCESSES)]
    reap.extend(children)
    for child in children:
        child.start()
    try:
        done = wait_for_count(redis_client, counter_key(name, "children-done"), PROCESSES)
        assert done == PROCESSES
        connected = _named_clients(redis_client, client_name)
    finally:
        hold.set()
    reports = collect(results, PROCESSES)
    join_all(children)

    # one connection per child plus the parent's own, each with its own socket
    assert len(connected) == PROCESSES + 1
    assert len({c["id"] for c in connected}) == PROCESSES + 1
    assert len({c["addr"] for c in connected}) == PROCESSES + 1
    assert parent_clients[0]["id"] in {c["id"] for c in connected}
    for report in reports:
        assert report["outcomes"] == ["ok", "failed"] * 3
    # the parent's connection was not disturbed, and every child's calls were counted
    assert breaker.call(lambda: "ok") == "ok"
    assert breaker.metrics().calls == 1 + PROCESSES * 6 + 1


def test_breaker_used_after_a_bare_os_fork(name: str, redis_url: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url, sliding_window_size=10,
                             minimum_number_of_calls=10)
    assert breaker.call(lambda: 1) == 1
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running pytest's teardown
        code = 1
        try:
            ok = breaker.call(lambda: 2) == 2 and breaker.metrics().calls == 2
            os.write(write_end, str(breaker._client.client_id()).encode())
            code = 0 if ok else 1
        finally:
            os._exit(code)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    child_connection = int(os.read(read_end, 64) or b"0")
    os.close(read_end)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child_connection != breaker._client.client_id()
    assert breaker.call(lambda: 3) == 3
    assert breaker.metrics().calls == 3

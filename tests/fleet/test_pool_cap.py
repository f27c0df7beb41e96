"""max_ejection_percent holds for a fleet of real processes: 4 workers against a pool of 10
members, 6 of them bad, at most 50 % ejected. Ejections are short, so the bad members go
round and round (ejected, probed, ejected again) while every worker races for the last
slot: at no moment are more than 5 ejected, by the pool's own history (each decision
with its server time) and by reads taken while the workers run."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import redis

from distbreaker._runtime.keys import PoolKeys
from distbreaker.readside_pool import read_pool
from tests.helpers import pool_worker
from tests.helpers.processes import collect, join_all

SPAWN = multiprocessing.get_context("spawn")
WORKERS = 4
SECONDS = 2.5
BAD = pool_worker.MEMBERS[:6]


def most_ejected_by_history(client: Any, name: str) -> tuple[int, int]:
    """(ejections recorded, the most members ejected at any decision): replays the
    history, each ejection active from its `at` to its `until` (server ms)."""
    entries = client.xrange(PoolKeys.build(name).history)
    latest: dict[str, tuple[int, int]] = {}  # member -> (at, until) of its last ejection
    most = ejections = 0
    for _, raw in entries:
        f = {k.decode(): v.decode() for k, v in raw.items()}
        at = int(f["at"])
        if f["event"] == "ejected":
            ejections += 1
            latest[f["member"]] = (at, int(f["until"]))
        elif f["event"] == "unejected":
            latest.pop(f["member"], None)
        active = sum(1 for start, until in latest.values() if start <= at < until)
        most = max(most, active)
    return ejections, most


def test_workers_never_eject_more_than_the_cap(name: str, redis_url: str,
                                               reap: list[Any]) -> None:
    results = SPAWN.Queue()
    start_at = time.time() + 3.0  # every worker imported and connected by then
    workers = [SPAWN.Process(target=pool_worker.run_for,
                             args=(redis_url, name, BAD, start_at, SECONDS, results))
               for _ in range(WORKERS)]
    reap.extend(workers)
    for worker in workers:
        worker.start()
    client = redis.Redis.from_url(redis_url)
    seen_most = reads = 0
    while time.time() < start_at + SECONDS:
        status = read_pool(client, "distbreaker", name)
        if status is not None and time.time() >= start_at:
            seen_most, reads = max(seen_most, status.ejected), reads + 1
        time.sleep(0.005)
    reports = collect(results, WORKERS, timeout=60)
    join_all(workers)
    calls = sum(r[0] for r in reports)
    assert sum(r[2] for r in reports) == 0, "a worker fell back to local picks"
    ejections, most = most_ejected_by_history(client, name)
    client.close()
    assert calls > 200 and reads > 20
    assert ejections >= 12, f"only {ejections} ejections: the cap was hardly contended"
    assert most == 5 and seen_most <= 5, (most, seen_most)

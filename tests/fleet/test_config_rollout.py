"""Config rollouts with real processes (docs/OPERATIONS.md, "Changing a breaker's
config"): six workers restarted one by one from config A to B and back to A. The new
config is in force from its first worker's call, the rollback likewise; no reset, the
window is kept (the threshold changed, not the window's shape), the state never moves,
and the breaker holds one config at every moment."""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

import redis

from distbreaker import BreakerConfig
from distbreaker import readside as view
from distbreaker._runtime.keys import DEFAULT_PREFIX
from distbreaker.breaker.core import config_fingerprint
from tests.helpers import rollout_worker
from tests.helpers.processes import collect, join_all
from tests.helpers.waiting import wait_until

SPAWN = multiprocessing.get_context("spawn")
FP_A = str(config_fingerprint(BreakerConfig(**rollout_worker.A).to_wire()))
FP_B = str(config_fingerprint(BreakerConfig(**rollout_worker.B).to_wire()))


class Worker:
    def __init__(self, url: str, name: str, config: dict[str, Any], results: Any,
                 reap: list[Any]) -> None:
        self.stop = SPAWN.Event()
        self.process = SPAWN.Process(target=rollout_worker.run,
                                     args=(url, name, config, self.stop, results))
        reap.append(self.process)
        self.process.start()

    def finish(self) -> None:
        self.stop.set()
        join_all([self.process])


def test_a_rolling_restart_to_b_and_back_needs_no_reset_and_keeps_the_window(
        name: str, redis_url: str, reap: list[Any]) -> None:
    client = redis.Redis.from_url(redis_url)
    samples: list[dict[str, Any]] = []
    sampling = threading.Event()

    def read() -> dict[str, Any] | None:
        return view.read_detail(client, DEFAULT_PREFIX, name)["breaker"]

    def deployed(fp: str) -> int:
        b = read()
        return next((c["workers"] for c in (b or {}).get("configs", ())
                     if c["fingerprint"] == fp), 0)

    def sample() -> None:
        while not sampling.is_set():
            b = read()
            if b is not None:
                samples.append({"in_force": b["config_in_force"]["fingerprint"],
                                "state": b["state"], "calls": b["window"]["calls"],
                                "generation": b["generation"]})
            sampling.wait(0.02)

    results = SPAWN.Queue()
    workers = [Worker(redis_url, name, rollout_worker.A, results, reap) for _ in range(6)]
    wait_until(lambda: deployed(FP_A) == 6, what="six workers run config A")
    wait_until(lambda: read()["window"]["calls"] == 50, what="the window fills")
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    reports = []
    for target, fp, other in ((rollout_worker.B, FP_B, FP_A), (rollout_worker.A, FP_A, FP_B)):
        for i in range(6):
            workers[i].finish()
            workers[i] = Worker(redis_url, name, target, results, reap)
            wait_until(lambda fp=fp, i=i, other=other: deployed(fp) == i + 1
                       and deployed(other) == 5 - i,
                       what=f"{i + 1} workers restarted onto {fp}")
            if i == 0:  # the first worker's call put the new config in force
                wait_until(lambda fp=fp: read()["config_in_force"]["fingerprint"] == fp,
                           what=f"config {fp} in force")
    for worker in workers:
        worker.finish()
    sampling.set()
    sampler.join(10)
    reports = collect(results, 18)

    in_force = [s["in_force"] for s in samples]
    changes = [fp for i, fp in enumerate(in_force) if i == 0 or fp != in_force[i - 1]]
    assert changes == [FP_A, FP_B, FP_A], changes       # one config at a time, A -> B -> A
    assert {s["state"] for s in samples} == {"CLOSED"}
    assert {s["generation"] for s in samples} == {0}    # no transition, no reset
    assert {s["calls"] for s in samples} == {50}        # the window was never emptied
    assert client.xlen(f"distbreaker:v2:{{{name}}}:cb:events") == 0
    assert sum(r[2] for r in reports) == 0              # nobody was rejected
    final = read()
    assert final["config"]["failure_rate_threshold"] == 50.0
    assert final["config_in_force"]["why"] == "newest deployment"

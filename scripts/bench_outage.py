#!/usr/bin/env python3
"""Redis faults, measured (issues 23 and 24): what a fleet does when Redis is killed, full,
black-holed, frozen, or hit by a connection burst.

Scenarios (each on a fresh ``redis-server``; workers are forked processes):

- ``kill``: P processes call a failing dependency through a CircuitBreaker and a
  Policy breaker, both OPEN with 60 s left; Redis is SIGKILLed for 2 s, then
  restarted. Reported: calls that reached the dependency while Redis was down, per
  process (max, and total).
- ``full``: P processes call through per-tenant breakers (``--tenants`` names each,
  built on first use); calls/s with Redis healthy, then with Redis full (maxmemory
  below used memory, noeviction: every write refused). The fallback runtime is
  loaded before timing (its one-time import is not what is compared).
- ``blackhole``: a Policy (breaker, bulkhead, budget) behind a TCP proxy that drops
  everything: the first attempt's duration against ``redis_timeout``, and the longest
  of the next 200 attempts.
- ``burst``: 50 threads and 50 coroutines at once on a bulkhead of 25 (max wait
  0.25 s) and a breaker: fallbacks (Redis marked down), peak permits, the longest
  wait before BulkheadFull.
- ``freeze``: 16 threads through a Policy; Redis SIGSTOPped for 0.4 s: the time from
  SIGCONT until the process uses Redis again.

Usage: ``.venv/bin/python scripts/bench_outage.py [--only kill,full,...]
[--processes 6] [--seconds 3] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

import distbreaker
import distbreaker.aio as aio
from distbreaker._runtime.health import shared_health
from distbreaker._runtime.local import LOCAL_RUNTIME
from distbreaker.demo.embedded import RedisServer
from distbreaker.errors import BulkheadFull, CallNotPermitted

FORK = multiprocessing.get_context("fork")
SCENARIOS = ("kill", "full", "blackhole", "burst", "freeze")


class Down(Exception):
    pass


def _in_fork(target: Callable[..., Any], *args: Any) -> Any:
    results = FORK.Queue()
    process = FORK.Process(target=lambda: results.put(target(*args)))
    process.start()
    try:
        return results.get(timeout=300)
    finally:
        process.join(30)


# -- kill ---------------------------------------------------------------------------------
def _kill_worker(url: str, phase: Any, ready: Any, results: Any) -> None:
    config = {"wait_duration_in_open_state": 60.0, "revalidate_interval": 0.2,
              "permitted_calls_in_half_open": 3, "redis_timeout": 5.0,
              "redis_retry_max_backoff": 0.2}
    breaker = distbreaker.CircuitBreaker("bench-cb", redis=url, **config)
    policy = distbreaker.Policy("bench-p", redis=url, breaker=config, retry=False)
    reached = {"cb": 0, "policy": 0}
    loops = 0

    def dependency(kind: str) -> None:
        if phase.value == 1:
            reached[kind] += 1
        raise Down

    while phase.value != 2:
        for kind, run in (("cb", breaker.call), ("policy", policy.call)):
            try:
                run(dependency, kind)
            except (Down, CallNotPermitted):
                pass
        loops += 1
        if loops == 20:
            ready.release()
        time.sleep(0.002)
    results.put(reached)


def kill(args: argparse.Namespace) -> dict[str, Any]:
    server = RedisServer().start()
    try:
        for name in ("bench-cb", "bench-p"):
            distbreaker.CircuitBreaker(name, redis=server.url,
                                       wait_duration_in_open_state=60.0).trip("bench")
        phase, ready, results = FORK.Value("i", 0), FORK.Semaphore(0), FORK.Queue()
        workers = [FORK.Process(target=_kill_worker, args=(server.url, phase, ready, results))
                   for _ in range(args.processes)]
        for process in workers:
            process.start()
        for _ in workers:
            ready.acquire(timeout=60)
        server.kill()
        phase.value = 1
        time.sleep(2.0)
        phase.value = 0
        server.start()
        time.sleep(0.3)
        phase.value = 2
        reached = [results.get(timeout=60) for _ in workers]
        for process in workers:
            process.join(30)
    finally:
        server.stop()
    return {"processes": args.processes,
            "max_per_process_cb": max(r["cb"] for r in reached),
            "max_per_process_policy": max(r["policy"] for r in reached),
            "total": sum(r["cb"] + r["policy"] for r in reached)}


# -- full ---------------------------------------------------------------------------------
def _full_worker(url: str, tenants: int, seconds: float, tag: str, go: Any,
                 results: Any) -> None:
    breakers: dict[int, distbreaker.CircuitBreaker] = {}
    # The fallback's runtime (fakeredis) loaded once per process before timing: what is
    # measured is the steady cost of the fallback and of building breakers, not the
    # one-time import (a few hundred ms of CPU at a process's first outage, during which
    # calls pass, counted for the local breaker).
    LOCAL_RUNTIME.wait(60)
    go.wait(60)
    calls, i = 0, 0
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        tenant = i % tenants
        i += 1
        breaker = breakers.get(tenant)
        if breaker is None:
            breaker = breakers[tenant] = distbreaker.CircuitBreaker(
                f"bench-tenant-{tag}-{os.getpid()}-{tenant}", redis=url,
                redis_timeout=5.0)
        try:
            breaker.call(lambda: None)
        except CallNotPermitted:
            pass
        calls += 1
    results.put(calls / seconds)


def _rate(url: str, args: argparse.Namespace, tag: str) -> float:
    go, results = FORK.Event(), FORK.Queue()
    workers = [FORK.Process(target=_full_worker, args=(url, args.tenants, args.seconds, tag,
                                                       go, results))
               for _ in range(args.processes)]
    for process in workers:
        process.start()
    go.set()
    rates = [results.get(timeout=120) for _ in workers]
    for process in workers:
        process.join(30)
    return sum(rates)


def full(args: argparse.Namespace) -> dict[str, Any]:
    server = RedisServer().start()
    admin = redis.Redis.from_url(server.url)
    try:
        healthy = _rate(server.url, args, "healthy")
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 1)
        filled = _rate(server.url, args, "full")
    finally:
        admin.close()
        server.stop()
    return {"processes": args.processes, "tenants_per_process": args.tenants,
            "healthy_calls_per_s": round(healthy), "full_calls_per_s": round(filled),
            "ratio": round(filled / healthy, 2)}


# -- blackhole ------------------------------------------------------------------------------
class _Proxy:
    """Forwards to Redis until `hole()`: then holds every byte (no RST, no FIN)."""

    def __init__(self, port: int) -> None:
        self.open = threading.Event()
        self.open.set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.upstream = port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self.open.wait()
                dst.sendall(data)
        except OSError:
            pass


def _blackhole_worker(url: str, timeout: float, holed: Any, go: Any) -> dict[str, Any]:
    policy = distbreaker.Policy("bench-bh", redis=url, bulkhead=True, budget=True,
                                retry=False, redis_timeout=timeout)
    for _ in range(3):
        policy.call(lambda: "ok")
    holed.set()
    go.wait(30)
    took = []
    for _ in range(200):
        started = time.monotonic()
        policy.call(lambda: "ok")
        took.append(time.monotonic() - started)
        time.sleep(0.01)
    return {"first_s": round(took[0], 3), "longest_later_s": round(max(took[1:]), 3),
            "later_over_half_timeout": sum(1 for t in took[1:] if t > timeout / 2)}


def blackhole(args: argparse.Namespace) -> dict[str, Any]:
    server = RedisServer().start()
    proxy = _Proxy(server.port)
    holed, go = FORK.Event(), FORK.Event()

    def hole() -> None:
        holed.wait(60)
        proxy.open.clear()
        go.set()

    threading.Thread(target=hole, daemon=True).start()
    try:
        result = _in_fork(_blackhole_worker, f"redis://127.0.0.1:{proxy.port}/0",
                          args.redis_timeout, holed, go)
    finally:
        proxy.open.set()
        server.stop()
    return {"redis_timeout_s": args.redis_timeout, **result}


# -- burst ----------------------------------------------------------------------------------
class _Outages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += "Redis unavailable" in record.getMessage()


def _burst_threads(url: str) -> dict[str, Any]:
    outages = _Outages()
    logging.getLogger("distbreaker").addHandler(outages)
    bulkhead = distbreaker.Bulkhead("bench-burst", redis=url, max_concurrent_calls=25,
                                    max_wait_duration=0.25)
    breaker = distbreaker.CircuitBreaker("bench-burst", redis=url)
    inside, peak, waits, lock = [0], [0], [], threading.Lock()
    barrier = threading.Barrier(50)

    def one() -> None:
        barrier.wait()
        for _ in range(3):
            started = time.monotonic()
            try:
                with bulkhead:
                    with lock:
                        inside[0] += 1
                        peak[0] = max(peak[0], inside[0])
                    breaker.call(time.sleep, 0.2)
                    with lock:
                        inside[0] -= 1
            except BulkheadFull:
                waits.append(time.monotonic() - started)

    threads = [threading.Thread(target=one) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"fallbacks": outages.count, "peak": peak[0],
            "longest_wait_s": round(max(waits, default=0.0), 3)}


def _burst_coroutines(url: str) -> dict[str, Any]:
    outages = _Outages()
    logging.getLogger("distbreaker").addHandler(outages)

    async def main() -> dict[str, Any]:
        bulkhead = aio.Bulkhead("bench-burst-aio", redis=url, max_concurrent_calls=25,
                                max_wait_duration=0.25)
        breaker = aio.CircuitBreaker("bench-burst-aio", redis=url)
        inside, peak, waits = [0], [0], []

        async def one() -> None:
            for _ in range(3):
                started = time.monotonic()
                try:
                    async with bulkhead:
                        inside[0] += 1
                        peak[0] = max(peak[0], inside[0])
                        await breaker.call(asyncio.sleep, 0.2)
                        inside[0] -= 1
                except BulkheadFull:
                    waits.append(time.monotonic() - started)

        await asyncio.gather(*(one() for _ in range(50)))
        return {"fallbacks": outages.count, "peak": peak[0],
                "longest_wait_s": round(max(waits, default=0.0), 3)}

    return asyncio.run(main())


def burst(args: argparse.Namespace) -> dict[str, Any]:
    server = RedisServer().start()
    try:
        out = {}
        for target, url in (("redis", server.url), ("memory", "memory://bench-burst")):
            out[f"threads_{target}"] = _in_fork(_burst_threads, url)
            out[f"coroutines_{target}"] = _in_fork(_burst_coroutines, url)
    finally:
        server.stop()
    return out


# -- freeze ---------------------------------------------------------------------------------
def _freeze_worker(url: str, frozen: Any, thawed: Any) -> float:
    policy = distbreaker.Policy("bench-freeze", redis=url,
                                bulkhead={"max_concurrent_calls": 25}, retry=False)
    health = shared_health(url, 5.0)
    stop = threading.Event()

    def caller() -> None:
        while not stop.is_set():
            policy.call(time.sleep, 0.01)

    threads = [threading.Thread(target=caller) for _ in range(16)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    frozen.set()
    while thawed.value == 0.0 or health.down:
        time.sleep(0.002)
    back = time.monotonic() - thawed.value
    stop.set()
    for thread in threads:
        thread.join()
    return back


def freeze(args: argparse.Namespace) -> dict[str, Any]:
    server = RedisServer().start()
    frozen, thawed = FORK.Event(), FORK.Value("d", 0.0)

    def stop_and_go() -> None:
        frozen.wait(60)
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)
        time.sleep(0.4)
        os.kill(server.process.pid, signal.SIGCONT)
        thawed.value = time.monotonic()

    threading.Thread(target=stop_and_go, daemon=True).start()
    try:
        back = _in_fork(_freeze_worker, server.url, frozen, thawed)
    finally:
        server.stop()
    return {"freeze_s": 0.4, "callers": 16, "back_on_redis_after_s": round(back, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--tenants", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--redis-timeout", type=float, default=0.25)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    results = {}
    for name in args.only.split(","):
        if name not in SCENARIOS:
            parser.error(f"unknown scenario {name!r} (one of {', '.join(SCENARIOS)})")
        results[name] = globals()[name](args)
        if not args.json:
            print(f"{name}: {results[name]}", flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Operator reach: how fast `distbreaker close NAME` lets every worker of a fleet through.

P worker processes (subprocesses of this script, ``--worker``) run T threads (sync) or
T tasks (asyncio) each, calling one exact-mode breaker whose 60 s open wait and 60 s
``revalidate_interval`` keep a worker's local OPEN view for a minute: only the pub/sub
push of the transition can end it sooner. Per round the bench trips the breaker, waits
until every thread is rejecting and every worker is subscribed, runs the real CLI
(``python -m distbreaker --url URL close NAME``) and records, per thread, the delay from
the transition's server time (its history entry's ``at_ms``) to the start of that
thread's first permitted call. Reported per flavour: p50/p95/p99/max over every thread
of every round, and how many threads were let through (of how many). Redis: a fresh
``redis-server`` unless ``--url`` or ``$REDIS_URL`` is given.

Usage: ``.venv/bin/python scripts/bench_reach.py [--processes 8] [--threads 4]
[--rounds 5] [--only sync,asyncio] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import redis

import distbreaker
from distbreaker import CallNotPermitted, CircuitBreaker, State
from distbreaker import aio as dbaio
from distbreaker.demo.embedded import bench_redis

FLAVOURS = ("sync", "asyncio")
#: The workers' breaker: a minute of OPEN and of trusting the local view.
CONFIG: dict[str, Any] = {"wait_duration_in_open_state": 60, "sliding_window_size": 10,
          "minimum_number_of_calls": 10, "revalidate_interval": 60}
PAUSE = 0.005  # between a worker thread's calls: 32 threads must not starve two cores
WAIT_S = 30.0  # every wait of the parent (far below the workers' 60 s OPEN view)
WORKER_LIFE_S = 300.0  # a worker gives up after this, whatever happens to its parent


# -- the worker (a subprocess: `bench_reach.py --worker URL NAME THREADS FLAVOUR ROUNDS`) --

def count_key(name: str, what: str, round_: int) -> str:
    return f"bench-reach:{name}:{what}:{round_}"


def worker_sync(url: str, name: str, threads: int, rounds: int, deadline: float,
                ready: redis.Redis, out: list[tuple[int, float]]) -> None:
    breaker = CircuitBreaker(name, redis=url, **CONFIG)

    def thread() -> None:
        started: list[float] = []
        for round_ in range(rounds):
            rejected = False
            while time.monotonic() < deadline:
                started.clear()
                try:
                    breaker.call(lambda: started.append(time.time()))
                except CallNotPermitted:
                    if not rejected:
                        rejected = True
                        ready.incr(count_key(name, "rejecting", round_))
                else:
                    if rejected:
                        out.append((round_, started[0]))
                        ready.incr(count_key(name, "permitted", round_))
                        break
                time.sleep(PAUSE)

    pool = [threading.Thread(target=thread) for _ in range(threads)]
    for each in pool:
        each.start()
    for each in pool:
        each.join()


async def worker_async(url: str, name: str, tasks: int, rounds: int, deadline: float,
                       ready: redis.Redis, out: list[tuple[int, float]]) -> None:
    breaker = dbaio.CircuitBreaker(name, redis=url, **CONFIG)

    async def task() -> None:
        started: list[float] = []

        async def note() -> None:
            started.append(time.time())

        for round_ in range(rounds):
            rejected = False
            while time.monotonic() < deadline:
                started.clear()
                try:
                    await breaker.call(note)
                except CallNotPermitted:
                    if not rejected:
                        rejected = True
                        ready.incr(count_key(name, "rejecting", round_))
                else:
                    if rejected:
                        out.append((round_, started[0]))
                        ready.incr(count_key(name, "permitted", round_))
                        break
                await asyncio.sleep(PAUSE)

    await asyncio.gather(*(task() for _ in range(tasks)))


def worker_main(argv: list[str]) -> int:
    """Print, as JSON, (round, wall-clock start of the first permitted call) per thread."""
    url, name, threads, flavour, rounds = argv[0], argv[1], int(argv[2]), argv[3], int(argv[4])
    deadline = time.monotonic() + WORKER_LIFE_S
    ready = redis.Redis.from_url(url)
    out: list[tuple[int, float]] = []
    if flavour == "asyncio":
        asyncio.run(worker_async(url, name, threads, rounds, deadline, ready, out))
    else:
        worker_sync(url, name, threads, rounds, deadline, ready, out)
    print(json.dumps(out))
    return 0


# -- the parent --

def wait_until(check: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:g} s: {what}")
        time.sleep(0.005)


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def subscribed(admin: redis.Redis, label: str) -> int:
    """Pub/sub connections the workers opened (named `label` through the URL)."""
    return sum(1 for c in admin.client_list()
               if c.get("name") == label and int(c.get("sub", 0)) > 0)


def run_flavour(url: str, flavour: str, processes: int, threads: int, rounds: int,
                progress: Callable[[str], None]) -> dict[str, Any]:
    """One fleet, `rounds` trip/close rounds: the delays and the counts."""
    name = f"bench-reach-{flavour}-{os.getpid()}-{secrets.token_hex(3)}"
    label = f"reach-{name}"[:60]
    admin = redis.Redis.from_url(url)
    breaker = CircuitBreaker(name, redis=url, subscribe=False, **CONFIG)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    sep = "&" if "?" in url else "?"
    everyone = processes * threads
    workers = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker",
                                 f"{url}{sep}client_name={label}", name, str(threads), flavour,
                                 str(rounds)], stdout=subprocess.PIPE, text=True, env=env)
               for _ in range(processes)]
    closed_at: list[float] = []
    cli_ms: list[float] = []

    def count(what: str, round_: int) -> int:
        return int(admin.get(count_key(name, what, round_)) or 0)

    try:
        for round_ in range(rounds):
            progress(f"{flavour}: round {round_ + 1} of {rounds}")
            if breaker.trip("bench") is not State.OPEN:
                raise RuntimeError("the breaker did not open")
            wait_until(lambda r=round_: count("rejecting", r) >= everyone,  # type: ignore[misc]
                       f"all {everyone} threads saw OPEN (round {round_})",
                       timeout=WAIT_S * (3 if round_ == 0 else 1))  # the first: start-up
            # every worker listens before the close (a late subscriber would miss the push)
            wait_until(lambda: subscribed(admin, label) >= processes,
                       f"all {processes} workers subscribed")
            started = time.perf_counter()
            closed = subprocess.run([sys.executable, "-m", "distbreaker", "--url", url,
                                     "close", name, "--reason", "bench"],
                                    capture_output=True, text=True, env=env, timeout=WAIT_S)
            cli_ms.append((time.perf_counter() - started) * 1000)
            if closed.returncode != 0:
                raise RuntimeError(f"distbreaker close failed: {closed.stderr}")
            (_, fields), = cast(list[tuple[bytes, dict[bytes, bytes]]],
                                admin.xrevrange(breaker.keys.history, count=1))
            if fields[b"to"] != b"CLOSED":
                raise RuntimeError(f"last transition: {fields!r}")
            closed_at.append(int(fields[b"at_ms"]) / 1000.0)
            # every thread got through (or the wait ran out) before the next trip
            with contextlib.suppress(TimeoutError):
                wait_until(lambda r=round_: count("permitted", r) >= everyone,  # type: ignore[misc]
                           f"all {everyone} threads were let through (round {round_})")
        outputs = [worker.communicate(timeout=WAIT_S)[0] for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
            worker.wait(10)
        for key in admin.scan_iter(match=f"*{name}*", count=1000):
            admin.delete(key)
        breaker.close()
        admin.close()
    permitted = [(r, t) for out in outputs for r, t in json.loads(out or "[]")]
    delays = [max(0.0, (t - closed_at[r]) * 1000) for r, t in permitted]
    row: dict[str, Any] = {
        "flavour": flavour, "rounds": rounds, "threads": everyone * rounds,
        "let_through": len(permitted),
        "let_through_per_round": [sum(1 for r, _ in permitted if r == k) for k in range(rounds)],
        "cli_p50_ms": round(percentile(cli_ms, 50), 1),
    }
    for pct in (50, 95, 99):
        row[f"p{pct}_ms"] = round(percentile(delays, pct), 1) if delays else None
    row["max_ms"] = round(max(delays), 1) if delays else None
    return row


def print_table(document: dict[str, Any]) -> None:
    run = document["run"]
    print(f"distbreaker {run['distbreaker']}, redis {run['redis_version']} ({run['redis']}), "
          f"python {run['python']}, {run['cpus']} cpus: {run['processes']} processes x "
          f"{run['threads']} threads/tasks, {run['rounds']} rounds, {run['wall_seconds']} s")
    header = (f"{'flavour':8} {'let through':>12} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
              f"{'max ms':>8} {'CLI ms':>8}")
    print(header)
    print("-" * len(header))
    for r in document["results"]:
        cells = [f"{r[k]:8.1f}" if r[k] is not None else f"{'-':>8}"
                 for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms", "cli_p50_ms")]
        print(f"{r['flavour']:8} {r['let_through']:>5} of {r['threads']:<5} {' '.join(cells)}")
    print("\ndelay: the close's server time (history at_ms) to each thread's first permitted "
          "call;\nCLI ms: the median wall time of `python -m distbreaker close` (start-up "
          "included).")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker_main(argv[1:])
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--url", help="Redis URL (default: $REDIS_URL, else spawn redis-server)")
    parser.add_argument("--processes", type=int, default=8, help="worker processes (default 8)")
    parser.add_argument("--threads", type=int, default=4,
                        help="threads (sync) or tasks (asyncio) per process (default 4)")
    parser.add_argument("--rounds", type=int, default=5, help="trip/close rounds (default 5)")
    parser.add_argument("--only", default=",".join(FLAVOURS),
                        help="comma-separated flavours (default sync,asyncio)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    flavours = [f.strip() for f in args.only.split(",") if f.strip()]
    if not flavours or set(flavours) - set(FLAVOURS):
        parser.error(f"--only: choose from {','.join(FLAVOURS)}")
    if args.processes < 1 or args.threads < 1 or not 1 <= args.rounds <= 50:
        parser.error("need --processes >= 1, --threads >= 1, 1 <= --rounds <= 50")

    def progress(text: str) -> None:
        print(f"  running {text} ...", file=sys.stderr, flush=True)

    started = time.monotonic()
    with bench_redis(args.url) as (url, origin):
        version = redis.Redis.from_url(url).info("server").get("redis_version", "?")
        results = [run_flavour(url, flavour, args.processes, args.threads, args.rounds, progress)
                   for flavour in flavours]
    document = {
        "run": {"distbreaker": distbreaker.__version__, "redis_version": version,
                "redis": origin, "python": sys.version.split()[0], "cpus": os.cpu_count(),
                "processes": args.processes, "threads": args.threads, "rounds": args.rounds,
                "wall_seconds": round(time.monotonic() - started, 1)},
        "results": results,
    }
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print_table(document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

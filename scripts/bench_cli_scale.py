#!/usr/bin/env python3
"""The CLI at 10,000 names: wall time of `ls`, `ls --json`, paging, `--top`, a selector's
`--dry-run` and a selector action, each a fresh `distbreaker` process against a real
redis-server holding ``--names`` keyed breakers (issue 26: `ls` and `ls --json` answer in
at most 2 s at 10,000 names).

The names are created by pipelines of the breaker script (FCALL, 500 per round trip),
as workers would leave them: keyed breakers ``tenant:<n>``, ``llm:<model>:<n>`` and
``pay:<n>``, each with a few recorded outcomes (failure rates spread from 0 to 100 %),
some tripped OPEN and asked again (so they count rejections). Reported per command:
min, median and max wall seconds over ``--runs`` runs (after one warm-up run), and the
child's CPU seconds. ``--profile`` also prints where one in-process `ls --json` spends
its time (SCAN, pipelined reads, decoding, JSON).

Usage: ``.venv/bin/python scripts/bench_cli_scale.py [--names 10000] [--runs 5] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

BATCH = 500


def scale_names(count: int) -> list[str]:
    """`count` keyed names: 60 % ``tenant:<n>``, 30 % ``llm:<model>:<n>``, 10 % ``pay:<n>``."""
    names = []
    for i in range(count):
        kind = i % 10
        if kind < 6:
            names.append(f"tenant:{i:05d}")
        elif kind < 9:
            names.append(f"llm:model-{i % 7}:{i:05d}")
        else:
            names.append(f"pay:{i:05d}")
    return names


def _chunks(items: Sequence[Any], size: int = BATCH) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def seed_breakers(client: Any, names: Sequence[str], prefix: str = "distbreaker",
                  key_ttl: float = 3600.0) -> dict[str, int]:
    """Store one breaker per name, as workers would leave it: name i records 20 calls of
    which ``i * 7 % 21`` failed (a count window of 20, minimum 10 calls, threshold 50 %:
    those with 10 or more failures trip OPEN); each OPEN one is then asked `i % 5` times
    (rejections). Pipelines of FCALL, `BATCH` per round trip. Returns how many ended in
    each state."""
    from distbreaker import BreakerConfig
    from distbreaker._runtime.scripts import load_script, run_scripts_each
    from distbreaker.breaker.core import BreakerCodec, decode_reply

    script = load_script("breaker")
    config = BreakerConfig(sliding_window_size=20, minimum_number_of_calls=10,
                           failure_rate_threshold=50, wait_duration_in_open_state=600,
                           key_ttl=key_ttl)
    db = int(client.connection_pool.connection_kwargs.get("db", 0))
    codecs = {name: BreakerCodec(name, config, prefix, db) for name in names}
    states: dict[str, int] = {}
    for chunk in _chunks(names):
        calls = []
        for name in chunk:
            i = int(name.rsplit(":", 1)[1])
            failures = i * 7 % 21
            call = codecs[name].batch_call((20 - failures, failures, 0, 20 * 5))
            calls.append((script, call.keys, call.args))
        replies = run_scripts_each(client, calls)
        asks = []
        for name, raw in zip(chunk, replies, strict=True):
            if isinstance(raw, Exception):
                raise raw
            state = decode_reply(raw).state.value
            states[state] = states.get(state, 0) + 1
            i = int(name.rsplit(":", 1)[1])
            if state == "OPEN":
                for _ in range(i % 5):
                    call, _token = codecs[name].acquire_call()
                    asks.append((script, call.keys, call.args))
        for raw in run_scripts_each(client, asks):
            if isinstance(raw, Exception):
                raise raw
    return states


def cli_command() -> list[str]:
    script = Path(sys.executable).with_name("distbreaker")
    return [str(script)] if script.exists() else [sys.executable, "-m", "distbreaker"]


def timed(argv: list[str], runs: int, env: dict[str, str],
          stdin: str | None = None) -> tuple[list[float], list[float], int]:
    """Wall and CPU seconds of `runs` runs after one warm-up run, and the output's size."""
    walls, cpus, size = [], [], 0
    for i in range(runs + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, check=False,
                              input=stdin.encode() if stdin is not None else None)
        elapsed = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(f"{argv} failed ({done.returncode}): {done.stderr.decode()}")
        size = len(done.stdout)
        if i:
            walls.append(elapsed)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return walls, cpus, size


def profile(url: str) -> dict[str, float]:
    """Where one in-process `ls --json` spends its time, in seconds of CPU (this
    process's: a loaded machine inflates wall time, not this)."""
    import redis

    from distbreaker import readside as view

    client = redis.Redis.from_url(url)
    out: dict[str, float] = {}
    start = time.process_time()
    found = view.scan(client, "distbreaker")
    out["scan"] = time.process_time() - start
    start = time.process_time()
    rows = view.read_rows(client, "distbreaker", found)
    out["read + decode rows"] = time.process_time() - start
    start = time.process_time()
    json.dumps({"breakers": rows}, sort_keys=True, separators=(",", ":"))
    out["json (one line, as ls --json above 1,000 rows)"] = time.process_time() - start
    start = time.process_time()
    view.rank_rows(client, "distbreaker", found.names, "failure-rate", 20)
    out["brief read, rank, 20 rows for --top 20"] = time.process_time() - start
    client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--names", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--url", default=None, help="a Redis to use (its db is flushed "
                        "of the bench's names first); default: a fresh redis-server")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import redis

    from distbreaker.demo.embedded import bench_redis

    cli = cli_command()
    rows: dict[str, dict[str, float]] = {}
    with bench_redis(args.url) as (url, origin):
        client = redis.Redis.from_url(url)
        names = scale_names(args.names)
        start = time.perf_counter()
        states = seed_breakers(client, names)
        seeded_s = time.perf_counter() - start
        client.close()
        env = {**os.environ, "DISTBREAKER_REDIS_URL": url}
        cases = {
            "ls": [*cli, "ls"],
            "ls --json": [*cli, "ls", "--json"],
            "ls --limit 50 --page 3": [*cli, "ls", "--limit", "50", "--page", "3"],
            "ls --json --limit 50": [*cli, "ls", "--json", "--limit", "50"],
            "ls --top 20": [*cli, "ls", "--top", "20"],
            "ls --top 20 --by rejections": [*cli, "ls", "--top", "20", "--by", "rejections"],
            "ls 'llm:*' --state open": [*cli, "ls", "llm:*", "--state", "open"],
            "open 'llm:*' --for 10m --dry-run": [*cli, "open", "llm:*", "--for", "10m",
                                                 "--dry-run"],
            "open 'pay:*' --for 10m --yes (1,000)": [*cli, "open", "pay:*", "--for", "10m",
                                                 "--yes", "--reason", "bench"],
        }
        for label, argv in cases.items():
            walls, cpus, size = timed(argv, args.runs, env)
            rows[label] = {"min": min(walls), "median": statistics.median(walls),
                           "max": max(walls), "cpu_median": statistics.median(cpus),
                           "stdout_bytes": size}
        where = profile(url) if args.profile else {}
    result = {"redis": origin, "names": args.names, "states": states,
              "seed_s": seeded_s, "load": os.getloadavg(), "results": rows,
              "profile": where}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    seeded = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
    print(f"Redis: {origin}; {args.names} names ({seeded}) seeded in {seeded_s:.1f} s; "
          f"load average {os.getloadavg()[0]:.2f} on "
          f"{os.cpu_count()} cores; {args.runs} runs each after a warm-up run")
    print(f"{'command':<36}{'min':>8}{'median':>8}{'max':>8}{'cpu':>8}{'stdout':>10}")
    for label, r in rows.items():
        print(f"{label:<36}{r['min']:8.3f}{r['median']:8.3f}{r['max']:8.3f}"
              f"{r['cpu_median']:8.3f}{r['stdout_bytes']:>10}")
    for step, seconds in where.items():
        print(f"profile (CPU): {step:<50}{seconds:8.3f} s")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""CLI start-up: wall time of `distbreaker --version`, `distbreaker ls` and friends.

Each command runs ``--runs`` times as a fresh process (the console script next to
this Python, else ``python -m distbreaker``), after ``--warmup`` unmeasured runs (page
cache), hyperfine-style; reported per command: min, median, mean and max in seconds,
beside the bare interpreter (``python -c pass``) and ``import redis`` (the floor of
any command that talks to Redis). ``ls`` and ``show`` read a fresh redis-server
holding a few breakers (or ``--url`` / ``$REDIS_URL``). The package is byte-compiled
first, as pip does when it installs a wheel (a checkout run with
PYTHONDONTWRITEBYTECODE would otherwise compile every module on every start). The
goal (issue 28): ``--version`` and ``ls`` start in at most 0.3 s.

Usage: ``.venv/bin/python scripts/bench_cli_start.py [--runs 20] [--warmup 3] [--json]``
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from distbreaker.demo.embedded import bench_redis


def cli_command() -> list[str]:
    script = Path(sys.executable).with_name("distbreaker")
    return [str(script)] if script.exists() else [sys.executable, "-m", "distbreaker"]


def timed(argv: list[str], runs: int, warmup: int,
          env: dict[str, str]) -> tuple[list[float], list[float]]:
    """Wall times and CPU times (user + system of the child: what a busy shared
    machine inflates least) of `runs` runs."""
    walls, cpus = [], []
    for i in range(warmup + runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, check=False)
        elapsed = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(f"{argv} failed ({done.returncode}): {done.stderr.decode()}")
        if i >= warmup:
            walls.append(elapsed)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return walls, cpus


def seed(url: str) -> None:
    """A few breakers for `ls` and `show` to read (one of them OPEN)."""
    from distbreaker import CircuitBreaker

    for i in range(5):
        breaker = CircuitBreaker(f"bench-cli-{i}", redis=url, minimum_number_of_calls=2,
                                 sliding_window_size=2, redis_timeout=5)
        for _ in range(2):
            try:
                breaker.call(lambda i=i: 1 / (i % 2))
            except ZeroDivisionError:
                pass
        breaker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--url", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cli = cli_command()
    import distbreaker

    compileall.compile_dir(os.path.dirname(distbreaker.__file__), quiet=1)
    rows = {}
    with bench_redis(args.url) as (url, origin):
        seed(url)
        env = {**os.environ, "DISTBREAKER_REDIS_URL": url}
        cases = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "python -c 'import redis'": [sys.executable, "-c", "import redis"],
            "... without OpenTelemetry": [sys.executable, "-c", "import sys; sys.modules["
                                          "'opentelemetry'] = None; import redis"],
            "distbreaker --version": [*cli, "--version"],
            "distbreaker --help": [*cli, "--help"],
            "distbreaker ls": [*cli, "ls"],
            "distbreaker show NAME": [*cli, "show", "bench-cli-0"],
        }
        for label, argv in cases.items():
            t, cpu = timed(argv, args.runs, args.warmup, env)
            rows[label] = {"min": min(t), "median": statistics.median(t),
                           "mean": statistics.fmean(t), "max": max(t), "runs": len(t),
                           "cpu_median": statistics.median(cpu)}
    if args.json:
        print(json.dumps({"redis": origin, "load": os.getloadavg(), "results": rows},
                         indent=2))
        return
    print(f"Redis: {origin}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores;"
          f" {args.runs} runs each after {args.warmup} warm-up runs")
    print(f"{'command':<28}{'min':>8}{'median':>8}{'mean':>8}{'max':>8}{'cpu':>8}"
          "   (seconds of wall time; cpu: median user+system)")
    for label, r in rows.items():
        print(f"{label:<28}{r['min']:8.3f}{r['median']:8.3f}{r['mean']:8.3f}{r['max']:8.3f}"
              f"{r['cpu_median']:8.3f}")


if __name__ == "__main__":
    main()

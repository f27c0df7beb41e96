"""What the CLI tests share: run a command with click's runner, build breakers with a
small window, and make them fail."""

from __future__ import annotations

from click.testing import CliRunner, Result

from distbreaker import CallNotPermitted, CircuitBreaker
from distbreaker.cli import cli

FAST = {"sliding_window_size": 10, "minimum_number_of_calls": 4,
        "failure_rate_threshold": 50, "wait_duration_in_open_state": 30.0,
        "permitted_calls_in_half_open": 2, "key_ttl": 600.0,
        "redis_timeout": 5.0}  # not about timeouts: a busy CI machine must not fail open


def run(url: str, *args: str) -> Result:
    """`distbreaker --url URL ARGS...` in this process."""
    return CliRunner().invoke(cli, ["--url", url, *args])


def make(name: str, url: object, **overrides: object) -> CircuitBreaker:
    return CircuitBreaker(name, redis=url, **{**FAST, **overrides})


def boom() -> None:
    raise ConnectionError("down")


def outcomes(breaker: CircuitBreaker, failed: int, ok: int = 0) -> None:
    """`ok` successful calls, then `failed` failing ones (rejections included)."""
    for _ in range(ok):
        breaker.call(lambda: None)
    for _ in range(failed):
        try:
            breaker.call(boom)
        except (ConnectionError, CallNotPermitted):
            pass


def fail(breaker: CircuitBreaker, times: int) -> None:
    outcomes(breaker, times)

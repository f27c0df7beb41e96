"""Bad input: every public constructor and CLI command, table-driven.

Each invalid value gives ONE clear error (ValueError or TypeError, not chained
to another exception; exit code 2 with a single ``Error:`` line for the CLI)
whose message names the offending field, and nothing is written to Redis
(DBSIZE 0 before and after, against the real redis-server fixture). Names with
braces are valid: all keys of such a name still share one hash slot.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from redis.crc import key_slot

import distbreaker.aio as aio
from distbreaker import Bulkhead, CircuitBreaker, Policy, Retry, RetryBudget
from distbreaker._runtime.keys import BreakerKeys, BudgetKeys, BulkheadKeys
from distbreaker.breaker.config import BreakerConfig
from distbreaker.budget.config import BudgetConfig
from distbreaker.bulkhead.config import BulkheadConfig
from distbreaker.cli.app import cli
from distbreaker.ganesha.aio import GaneshaBreaker as AioGaneshaBreaker
from distbreaker.ganesha.config import GaneshaConfig
from distbreaker.ganesha.sync import GaneshaBreaker
from distbreaker.retry.config import RetryConfig
from tests.unit.test_config import INVALID

BAD_NAMES: list[tuple[str, Any]] = [
    ("empty", ""), ("201 chars", "x" * 201), ("space", "a b"), ("newline", "a\nb"),
    ("tab", "a\tb"), ("NUL", "a\x00b"), ("escape", "a\x1bb"), ("DEL", "a\x7fb"),
    ("list", ["a"]), ("int", 42), ("None", None), ("bytes", b"abc"),
    ("leading close brace", "}{"),  # an empty hash tag: keys would spread over slots
]

#: Invalid values per config field, shared by the configs and the components using them.
BREAKER_FIELDS: list[tuple[str, Any]] = [
    ("failure_rate_threshold", 0), ("failure_rate_threshold", 101),
    ("failure_rate_threshold", -5), ("failure_rate_threshold", "50"),
    ("failure_rate_threshold", math.nan), ("failure_rate_threshold", None),
    ("slow_call_rate_threshold", 0), ("slow_call_rate_threshold", 100.5),
    ("slow_call_duration", 0), ("slow_call_duration", "fast"), ("slow_call_duration", -1),
    ("sliding_window_type", "SLIDING"), ("sliding_window_type", 3),
    ("sliding_window_size", 0), ("sliding_window_size", -1), ("sliding_window_size", "10"),
    ("sliding_window_size", 10.5), ("sliding_window_size", True),
    ("sliding_window_size", 100_001),
    ("minimum_number_of_calls", 0), ("minimum_number_of_calls", "5"),
    ("wait_duration_in_open_state", -1), ("wait_duration_in_open_state", "30x"),
    ("wait_duration_in_open_state", 0), ("wait_duration_in_open_state", math.inf),
    ("wait_duration_in_open_state", timedelta(seconds=-1)),
    ("permitted_calls_in_half_open", 0), ("permitted_calls_in_half_open", -3),
    ("permitted_calls_in_half_open", [1]),
    ("max_wait_in_half_open", -1), ("half_open_lease", 0), ("key_ttl", -1),
    ("key_ttl", 1.0), ("record_exceptions", [ValueError, "x"]),
    ("ignore_exceptions", 3), ("record_predicate", 3), ("ignore_predicate", "x"),
    ("on_redis_error", "ignore"), ("redis_timeout", 0), ("redis_timeout", "quick"),
    ("redis_retry_max_backoff", -1),
]
BULKHEAD_FIELDS: list[tuple[str, Any]] = [
    ("max_concurrent_calls", 0), ("max_concurrent_calls", -1),
    ("max_concurrent_calls", "5"), ("max_concurrent_calls", 2.5),
    ("max_concurrent_calls", None), ("max_wait_duration", -1), ("max_wait_duration", "1m30"),
    ("lease", 0), ("lease", 0.001), ("lease", "PT"), ("expected_workers", 0),
    ("expected_workers", "8"), ("fallback_limit", -1), ("fallback_limit", 1.5),
    ("key_ttl", 1.0), ("redis_timeout", 0), ("redis_retry_max_backoff", "x"),
]
RETRY_FIELDS: list[tuple[str, Any]] = [
    ("max_attempts", 0), ("max_attempts", "3"), ("max_attempts", -1),
    ("base", -1), ("base", "0.1x"), ("multiplier", 0.5), ("multiplier", "2"),
    ("cap", -1), ("jitter", "random"), ("retry_on", ["x"]), ("retry_on", 3), ("ignore", [1]),
    ("deadline", 0), ("deadline", "soon"), ("max_retry_after", -1),
    ("retry_predicate", 1), ("respect_retry_after", "yes"), ("http_classifier", 3),
]
BUDGET_FIELDS: list[tuple[str, Any]] = [
    ("percent_can_retry", -0.1), ("percent_can_retry", 11), ("percent_can_retry", "0.2"),
    ("min_retries_per_sec", -1), ("min_retries_per_sec", math.nan),
    ("ttl", 0), ("ttl", "10 seconds"), ("ttl", 100_000), ("slices", 0), ("slices", 101),
    ("slices", "10"), ("deposit_batch", 0), ("redis_timeout", 0),
]
GANESHA_FIELDS: list[tuple[str, Any]] = [
    ("failure_rate_threshold", 0), ("failure_rate_threshold", 150),
    ("interval_to_half_open", 0), ("interval_to_half_open", "5"),
    ("minimum_requests", 0), ("time_window", 0), ("time_window", 1.5),
    ("prefix", "a b"), ("prefix", 3), ("success_suffix", "a\nb"), ("key_ttl", -1),
    ("redis_timeout", "x"),
]


def breaker(url: str, **kw: Any) -> Any:
    return CircuitBreaker(kw.pop("name", "dep"), redis=url, **kw)


def case_id(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 20 else text[:17] + "..."


def cases() -> list[Any]:
    """(label, build(url), field the message must name)."""
    out: list[Any] = []

    def add(label: str, build: Callable[[str], Any], field: str) -> None:
        out.append(pytest.param(build, field, id=label))

    named: list[tuple[str, Callable[[str, Any], Any]]] = [
        ("CircuitBreaker", lambda url, n: CircuitBreaker(n, redis=url)),
        ("Bulkhead", lambda url, n: Bulkhead(n, redis=url)),
        ("RetryBudget", lambda url, n: RetryBudget(n, redis=url)),
        ("Policy", lambda url, n: Policy(n, redis=url, bulkhead=True, budget=True)),
        ("aio.CircuitBreaker", lambda url, n: aio.CircuitBreaker(n, redis=url)),
        ("aio.Bulkhead", lambda url, n: aio.Bulkhead(n, redis=url)),
        ("aio.RetryBudget", lambda url, n: aio.RetryBudget(n, redis=url)),
        ("aio.Policy", lambda url, n: aio.Policy(n, redis=url, bulkhead=True)),
    ]
    for owner, build in named:
        for label, bad in BAD_NAMES:
            add(f"{owner}-name-{label}", lambda url, b=build, v=bad: b(url, v), "name")
    for owner, build in [("GaneshaBreaker", GaneshaBreaker), ("aio.GaneshaBreaker",
                                                             AioGaneshaBreaker)]:
        for label, bad in [("empty", ""), ("space", "a b"), ("control", "a\x01b"),
                           ("list", ["a"])]:
            add(f"{owner}-service-{label}", lambda url, b=build, v=bad: b(v, redis=url),
                "service")

    tables: list[tuple[str, list[tuple[str, Any]], list[tuple[str, Callable[..., Any]]]]] = [
        ("breaker", BREAKER_FIELDS, [
            ("BreakerConfig", lambda url, **kw: BreakerConfig(**kw)),
            ("CircuitBreaker", lambda url, **kw: CircuitBreaker("dep", redis=url, **kw)),
            ("aio.CircuitBreaker", lambda url, **kw: aio.CircuitBreaker("dep", redis=url, **kw)),
            ("Policy(breaker=)", lambda url, **kw: Policy("dep", redis=url, breaker=kw)),
        ]),
        ("bulkhead", BULKHEAD_FIELDS, [
            ("BulkheadConfig", lambda url, **kw: BulkheadConfig(**kw)),
            ("Bulkhead", lambda url, **kw: Bulkhead("dep", redis=url, **kw)),
            ("aio.Bulkhead", lambda url, **kw: aio.Bulkhead("dep", redis=url, **kw)),
            ("Policy(bulkhead=)", lambda url, **kw: Policy("dep", redis=url, bulkhead=kw)),
        ]),
        ("retry", RETRY_FIELDS, [
            ("RetryConfig", lambda url, **kw: RetryConfig(**kw)),
            ("Retry", lambda url, **kw: Retry(**kw)),
            ("aio.Retry", lambda url, **kw: aio.Retry(**kw)),
            ("Policy(retry=)", lambda url, **kw: Policy("dep", redis=url, retry=kw)),
        ]),
        ("budget", BUDGET_FIELDS, [
            ("BudgetConfig", lambda url, **kw: BudgetConfig(**kw)),
            ("RetryBudget", lambda url, **kw: RetryBudget("dep", redis=url, **kw)),
            ("aio.RetryBudget", lambda url, **kw: aio.RetryBudget("dep", redis=url, **kw)),
            ("Policy(budget=)", lambda url, **kw: Policy("dep", redis=url, budget=kw)),
        ]),
        ("ganesha", GANESHA_FIELDS, [
            ("GaneshaConfig", lambda url, **kw: GaneshaConfig(**kw)),
            ("GaneshaBreaker", lambda url, **kw: GaneshaBreaker("svc", redis=url, **kw)),
            ("aio.GaneshaBreaker",
             lambda url, **kw: AioGaneshaBreaker("svc", redis=url, **kw)),
        ]),
    ]
    for _, fields, builders in tables:
        for owner, build in builders:
            for field, bad in fields:
                add(f"{owner}-{field}={case_id(bad)}",
                    lambda url, b=build, f=field, v=bad: b(url, **{f: v}), field)

    misc: list[tuple[str, Callable[[str], Any], str]] = [
        ("CircuitBreaker-unknown-option", lambda url: breaker(url, failure_rate=5),
         "failure_rate"),
        ("Bulkhead-unknown-option", lambda url: Bulkhead("dep", redis=url, limit=5), "limit"),
        ("RetryBudget-unknown-option", lambda url: RetryBudget("dep", redis=url, pct=1), "pct"),
        ("Retry-unknown-option", lambda url: Retry(attempts=3), "attempts"),
        ("GaneshaBreaker-unknown-option", lambda url: GaneshaBreaker("s", redis=url, x=1), "x"),
        ("CircuitBreaker-config-wrong-type", lambda url: breaker(url, config={"a": 1}),
         "config"),
        ("Bulkhead-config-wrong-type",
         lambda url: Bulkhead("dep", redis=url, config=BreakerConfig()), "config"),
        ("RetryBudget-config-wrong-type",
         lambda url: RetryBudget("dep", redis=url, config=RetryConfig()), "config"),
        ("Retry-config-wrong-type", lambda url: Retry(BudgetConfig()), "config"),
        ("CircuitBreaker-redis-int", lambda url: CircuitBreaker("dep", redis=42), "redis"),
        ("Bulkhead-redis-list", lambda url: Bulkhead("dep", redis=[url]), "redis"),
        ("aio.CircuitBreaker-sync-client",
         lambda url: aio.CircuitBreaker("dep", redis=redis.Redis.from_url(url)), "asyncio"),
        ("CircuitBreaker-prefix-brace", lambda url: breaker(url, prefix="a{b"), "prefix"),
        ("CircuitBreaker-prefix-empty", lambda url: breaker(url, prefix=""), "prefix"),
        ("Bulkhead-prefix-space", lambda url: Bulkhead("dep", redis=url, prefix="a b"),
         "prefix"),
        ("Policy-fallback-not-callable",
         lambda url: Policy("dep", redis=url, fallback=3), "fallback"),
        ("Policy-fallback_on_client_error-str",
         lambda url: Policy("dep", redis=url, fallback_on_client_error="yes"),
         "fallback_on_client_error"),
        ("Policy-prefix-brace", lambda url: Policy("dep", redis=url, prefix="{x}"), "prefix"),
        ("GaneshaConfig-same-suffixes",
         lambda url: GaneshaConfig(success_suffix="_s", failure_suffix="_s"), "suffixes"),
    ]
    for label, build, field in misc:
        add(label, build, field)
    return out


def dbsize(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.dbsize())
    finally:
        client.close()


@pytest.mark.parametrize(("build", "field"), cases())
def test_invalid_constructor_argument_gives_one_clear_error(
        build: Callable[[str], Any], field: str, redis_url: str) -> None:
    assert dbsize(redis_url) == 0
    with pytest.raises((ValueError, TypeError)) as caught:
        build(redis_url)
    error = caught.value
    assert field in str(error), f"{type(error).__name__}: {error}"
    assert error.__cause__ is None and (error.__context__ is None
                                        or error.__suppress_context__), "chained error"
    assert dbsize(redis_url) == 0


# -- the CLI ------------------------------------------------------------------------------

CLI_CASES: list[tuple[str, list[str], str]] = [
    ("show-empty-name", ["show", ""], "NAME"),
    ("show-201-chars", ["show", "x" * 201], "NAME"),
    ("show-space", ["show", "a b"], "NAME"),
    ("show-control", ["show", "a\x01b"], "NAME"),
    ("show-newline", ["show", "a\nb"], "NAME"),
    ("open-empty-name", ["open", "", "--reason", "r"], "NAME"),
    ("trip-control", ["trip", "a\tb", "--reason", "r"], "NAME"),
    ("close-201-chars", ["close", "y" * 201, "--reason", "r"], "NAME"),
    ("disable-space", ["disable", "a b", "--reason", "r"], "NAME"),
    ("metrics-only-empty", ["metrics-only", "", "--reason", "r"], "NAME"),
    ("reset-empty-name", ["reset", "", "--reason", "r"], "NAME"),
    ("release-stale-space", ["release-stale", "a b"], "NAME"),
    ("events-space", ["events", "a b"], "NAME"),
    ("events-count-0", ["events", "-n", "0"], "--count"),
    ("events-count-negative", ["events", "-n", "-5"], "--count"),
    ("events-count-text", ["events", "-n", "many"], "--count"),
    ("events-timeout-0", ["events", "-f", "--timeout", "0"], "--timeout"),
    ("events-timeout-text", ["events", "-f", "--timeout", "soon"], "--timeout"),
    ("events-max-events-0", ["events", "-f", "--max-events", "0"], "--max-events"),
    ("watch-interval-0", ["watch", "--interval", "0"], "--interval"),
    ("watch-interval-negative", ["watch", "--interval", "-1"], "--interval"),
    ("watch-interval-text", ["watch", "--interval", "abc"], "--interval"),
    ("watch-iterations-0", ["watch", "--iterations", "0"], "--iterations"),
    ("watch-state-bogus", ["watch", "--state", "BOGUS"], "--state"),
    ("ls-state-bogus", ["ls", "--state", "HALF"], "--state"),
    ("prefix-brace", ["--prefix", "a{b", "ls"], "--prefix"),
    ("prefix-empty", ["--prefix", "", "ls"], "--prefix"),
    ("prefix-space", ["--prefix", "a b", "ls"], "--prefix"),
    ("demo-workers-0", ["demo", "--workers", "0"], "--workers"),
    ("demo-duration-text", ["demo", "--duration", "long"], "--duration"),
    ("demo-name-empty", ["demo", "--name", ""], "--name"),
]


@pytest.mark.parametrize(("args", "field"), [pytest.param(a, f, id=i) for i, a, f in CLI_CASES])
def test_invalid_cli_input_exits_2_with_one_error_line(args: list[str], field: str,
                                                       redis_url: str) -> None:
    assert dbsize(redis_url) == 0
    result = CliRunner().invoke(cli, ["--url", redis_url, *args])
    output = result.output
    assert result.exit_code == 2, output
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and field in errors[0], output
    assert "Traceback" not in output
    assert dbsize(redis_url) == 0


def test_cli_bad_url_exits_2_with_one_error_line() -> None:
    result = CliRunner().invoke(cli, ["--url", "notaurl", "ls"])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "--url" in errors[0]


# -- names with braces are valid ------------------------------------------------------------

BRACE_NAMES = ["{payments}", "a{b}c", "{", "a}", "{}", "a}{b", "{{x}}", "tenant-{42}-api",
               "x{" * 50]


@pytest.mark.parametrize("name", BRACE_NAMES)
def test_names_with_braces_work_and_keep_one_hash_slot(name: str, redis_url: str,
                                                       redis_client: redis.Redis) -> None:
    keys = [*BreakerKeys.build(name).script_keys, *vars(BulkheadKeys.build(name)).values(),
            BudgetKeys.build(name).slices]
    assert len({key_slot(key.encode()) for key in keys}) == 1
    policy = Policy(name, redis=redis_url, bulkhead={"max_concurrent_calls": 2},
                    retry={"max_attempts": 2, "base": 0.001}, budget=True)
    assert policy.call(lambda: "ok") == "ok"
    assert policy.breaker.metrics().calls == 1
    assert policy.bulkhead.metrics().acquired == 1
    stored = {key.decode() for key in redis_client.keys("*")}
    assert BreakerKeys.build(name).state in stored
    assert BudgetKeys.build(name).slices in stored


def test_brace_name_works_with_the_asyncio_breaker(redis_url: str) -> None:
    async def main() -> int:
        breaker = aio.CircuitBreaker("svc-{eu}", redis=redis_url)

        async def ok() -> str:
            return "ok"

        assert await breaker.call(ok) == "ok"
        return (await breaker.metrics()).calls

    assert asyncio.run(main()) == 1


def test_brace_name_works_in_the_cli(redis_url: str) -> None:
    CircuitBreaker("a{b}c", redis=redis_url).call(lambda: None)
    result = CliRunner().invoke(cli, ["--url", redis_url, "show", "a{b}c", "--json"])
    assert result.exit_code == 0, result.output
    assert '"a{b}c"' in result.output


# every fourth BreakerConfig case of tests/unit/test_config.py, as CircuitBreaker keywords
@pytest.mark.parametrize("case", INVALID[::4], ids=[f"{c[0]}={c[1]!r}" for c in INVALID[::4]])
def test_breaker_keyword_overrides_are_validated_before_any_redis_io(
        case: tuple[str, Any, str], redis_url: str, redis_client: redis.Redis) -> None:
    field, value, _ = case
    with pytest.raises(ValueError, match=field):
        CircuitBreaker("cfg-test", redis=redis_url, **{field: value})
    assert redis_client.dbsize() == 0

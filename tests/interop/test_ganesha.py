"""Ganesha-compatible mode against a real redis-server: layout, decisions, atomicity."""

from __future__ import annotations

import multiprocessing
import re
import threading
import time

import pytest
import redis

from distbreaker.errors import CallNotPermitted, SchemaError
from distbreaker.ganesha.config import GaneshaEvent
from distbreaker.ganesha.sync import GaneshaBreaker

MEMBER = re.compile(r"^(\d{10})(\.\d{1,4})?:[0-9a-f]+-[0-9a-f]+$")


def make(url: str, service: str, **kw: object) -> GaneshaBreaker:
    options = {"failure_rate_threshold": 50, "minimum_requests": 10, "time_window": 30,
               "interval_to_half_open": 2}
    options.update(kw)
    return GaneshaBreaker(service, redis=url, **options)


def seed(client: redis.Redis, key: str, count: int, age: float = 0.0) -> None:
    """Members as PHP's Ganesha writes them: score = member = microtime(true)."""
    now = time.time() - age
    for i in range(count):
        t = now - i * 0.001
        client.zadd(key, {f"{t:.4f}".rstrip("0").rstrip("."): t})


def test_keys_are_written_in_ganeshas_layout(redis_url: str, redis_client: redis.Redis) -> None:
    breaker = make(redis_url, "pay")
    before = time.time()
    breaker.failure()
    breaker.success()
    assert redis_client.type("ganesha_pay_failure") == b"zset"
    assert redis_client.type("ganesha_pay_success") == b"zset"
    assert redis_client.get("ganesha_pay_status") == b"1"
    assert redis_client.ttl("ganesha_pay_failure") == -1  # Ganesha sets no TTL
    [(member, score)] = redis_client.zrange("ganesha_pay_failure", 0, -1, withscores=True)
    match = MEMBER.match(member.decode())
    assert match, member
    # PHP's (int) cast of the member reads the Unix second of the score
    assert int(match.group(1)) == int(score)
    assert before - 1 < score < time.time() + 1
    # precision 14: at most 4 decimals, no trailing zeros
    assert not (match.group(2) or ".x").endswith("0")


@pytest.mark.parametrize(("failures", "successes", "rejections", "available"), [
    (0, 50, 0, True),     # F == 0
    (4, 0, 0, True),      # F / minimum * 100 = 40 < 50
    (5, 4, 0, True),      # F + S + R = 9 < minimum 10
    (5, 5, 0, False),     # rate 50 % is not < 50
    (5, 6, 0, True),      # rate 45 % < 50
    (5, 4, 1, False),     # rejections count toward the minimum, not the rate
    (6, 6, 0, False),     # rate 50 %
    (6, 7, 0, True),      # rate 46 %
])
def test_decision_table(redis_url: str, redis_client: redis.Redis, failures: int,
                        successes: int, rejections: int, available: bool) -> None:
    seed(redis_client, "ganesha_svc_failure", failures)
    seed(redis_client, "ganesha_svc_success", successes)
    seed(redis_client, "ganesha_svc_rejection", rejections)
    breaker = make(redis_url, "svc", interval_to_half_open=60)
    assert breaker.is_available() is available
    rejected = redis_client.zcard("ganesha_svc_rejection") - rejections
    assert rejected == (0 if available else 1)


def test_half_open_after_interval_lets_requests_through(redis_url: str,
                                                        redis_client: redis.Redis) -> None:
    seed(redis_client, "ganesha_h_failure", 10, age=3.0)
    breaker = make(redis_url, "h", interval_to_half_open=2)
    assert breaker.is_available() is True          # last failure 3 s ago > 2 s
    breaker.failure()
    assert breaker.is_available() is False         # a fresh failure: open again


def test_trip_and_calm_down_events(redis_url: str, redis_client: redis.Redis) -> None:
    breaker = make(redis_url, "ev", minimum_requests=4)
    events: list[GaneshaEvent] = []
    breaker.add_listener(lambda service, event: events.append(event))
    for _ in range(4):
        breaker.failure()
    assert events == [GaneshaEvent.TRIPPED]
    assert redis_client.get("ganesha_ev_status") == b"2"
    with pytest.raises(CallNotPermitted):
        breaker.call(lambda: "never")
    breaker.success()
    assert events == [GaneshaEvent.TRIPPED, GaneshaEvent.CALMED_DOWN]
    assert redis_client.get("ganesha_ev_status") == b"1"


def test_old_members_are_trimmed(redis_url: str, redis_client: redis.Redis) -> None:
    seed(redis_client, "ganesha_t_success", 100, age=10.0)
    breaker = make(redis_url, "t", time_window=5)
    breaker.success()
    assert redis_client.zcard("ganesha_t_success") == 1


def test_no_event_is_lost_under_concurrency(redis_url: str, redis_client: redis.Redis) -> None:
    breaker = make(redis_url, "busy", minimum_requests=1_000_000)

    def hammer() -> None:
        for _ in range(100):
            breaker.failure()

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert redis_client.zcard("ganesha_busy_failure") == 400


def _fail_many(url: str, start: threading.Event | None, queue: multiprocessing.Queue) -> None:
    breaker = make(url, "fleet", minimum_requests=20)
    events: list[str] = []
    breaker.add_listener(lambda service, event: events.append(event.value))
    for _ in range(30):
        breaker.failure()
    queue.put(events)


def test_tripped_fires_once_across_processes(redis_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_fail_many, args=(redis_url, None, queue)) for _ in range(4)]
    for proc in procs:
        proc.start()
    results = [queue.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(30)
    assert sum(r.count("tripped") for r in results) == 1


def test_foreign_data_is_a_schema_error(redis_url: str, redis_client: redis.Redis) -> None:
    redis_client.set("ganesha_bad_failure", "x")
    with pytest.raises(SchemaError, match="ganesha_bad_failure"):
        make(redis_url, "bad").failure()


def test_async_twin_shares_the_same_keys_and_decisions(redis_url: str,
                                                       redis_client: redis.Redis) -> None:
    import asyncio

    from distbreaker.ganesha.aio import GaneshaBreaker as AsyncGaneshaBreaker

    async def scenario() -> list[object]:
        breaker = AsyncGaneshaBreaker("asy", redis=redis_url, minimum_requests=3,
                                      interval_to_half_open=60)
        events: list[object] = []
        breaker.add_listener(lambda service, event: events.append(event))

        async def boom() -> None:
            raise RuntimeError("down")

        for _ in range(3):
            with pytest.raises(RuntimeError):
                await breaker.call(boom)
        with pytest.raises(CallNotPermitted):
            await breaker.call(boom)
        return events

    events = asyncio.run(scenario())
    assert events == [GaneshaEvent.TRIPPED]
    assert redis_client.zcard("ganesha_asy_failure") == 3
    assert redis_client.zcard("ganesha_asy_rejection") == 1
    # the sync breaker sees the same state
    assert make(redis_url, "asy", minimum_requests=3, interval_to_half_open=60).is_available() \
        is False


def test_fail_open_when_redis_is_unreachable() -> None:
    from distbreaker.demo.embedded import free_port

    breaker = GaneshaBreaker("down", redis=f"redis://127.0.0.1:{free_port()}/0")
    assert breaker.is_available() is True
    assert breaker.call(lambda: 42) == 42


def test_cli_lists_shows_and_resets_ganesha_services(redis_url: str,
                                                     redis_client: redis.Redis) -> None:
    import json

    from click.testing import CliRunner

    from distbreaker.cli.app import cli

    breaker = make(redis_url, "orders", minimum_requests=2)
    breaker.failure()
    breaker.failure()
    make(redis_url, "users").success()
    runner = CliRunner()
    listed = runner.invoke(cli, ["--url", redis_url, "ganesha", "ls", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {row["service"]: row for row in json.loads(listed.output)}
    assert set(rows) == {"orders", "users"}
    assert rows["orders"]["status"] == "tripped" and rows["orders"]["failures"] == 2
    assert rows["users"]["status"] == "calmed_down" and rows["users"]["successes"] == 1
    shown = runner.invoke(cli, ["--url", redis_url, "ganesha", "show", "orders"])
    assert shown.exit_code == 0 and "tripped" in shown.output
    refused = runner.invoke(cli, ["--url", redis_url, "ganesha", "reset", "orders"])
    assert refused.exit_code == 2
    assert redis_client.exists("ganesha_orders_failure")
    done = runner.invoke(cli, ["--url", redis_url, "ganesha", "reset", "orders", "--yes"])
    assert done.exit_code == 0, done.output
    assert not redis_client.exists("ganesha_orders_failure", "ganesha_orders_status")
    missing = runner.invoke(cli, ["--url", redis_url, "ganesha", "show", "orders"])
    assert missing.exit_code == 1

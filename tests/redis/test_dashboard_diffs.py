"""The dashboard hub against a real Redis: after the first read it sends only the rows that
changed (nothing while nothing changes), the keys of rows gone, rate limiter rows with
their rates, reporting workers, and p50/p99 latency of time windows too. The page side is
tests/fleet/test_dashboard_scale_browser.py."""

from __future__ import annotations

import time
from typing import Any

import redis

from distbreaker import CircuitBreaker, RateLimiter
from distbreaker.dashboard.hub import Hub


class Recorder:
    """A hub whose broadcasts are kept (no event loop, no browser)."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.hub = Hub(lambda: redis.Redis.from_url(url), "distbreaker", 0.2)
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.hub._broadcast = lambda kind, data: self.sent.append((kind, data))  # type: ignore[method-assign]

    def tick(self, *, whole: bool = False, moved: set[str] | None = None,
             wait: bool = False) -> list[dict[str, Any]]:
        """One read (`wait`: a second after the last, as a rate needs); the updates sent."""
        if wait:
            time.sleep(1.05)
        self.sent.clear()
        self.hub._tick(self.client, moved or set(), whole=whole)
        return [data for kind, data in self.sent if kind == "update"]

    def rows(self) -> dict[str, dict[str, Any]]:
        snapshot = self.hub.first_messages()[-1][1]
        return {r["name"]: r for r in snapshot["rows"]}


def test_only_changed_rows_are_sent_and_nothing_while_nothing_changes(redis_url: str) -> None:
    breakers = [CircuitBreaker(f"tenant:{i}", redis=redis_url, key_ttl=600) for i in range(30)]
    for b in breakers:
        b.call(lambda: None)
    seen = Recorder(redis_url)
    seen.tick(whole=True)
    assert len(seen.rows()) == 30
    seen.tick(wait=True)                          # each row's rates: from "-" to 0/s, once
    assert seen.tick() == []                      # nothing changed: nothing sent
    breakers[7].call(lambda: None)
    updates = seen.tick(wait=True)
    assert [[r["name"] for r in u["rows"]] for u in updates] == [["tenant:7"]]
    row = updates[0]["rows"][0]
    assert row["breaker"]["calls"] == 2 and row["rates"]["calls"] > 0
    assert updates[0]["seq"] > 0 and updates[0]["total"] == 30
    assert [[r["name"] for r in u["rows"]] for u in seen.tick(wait=True)] == [["tenant:7"]]  # 0/s
    assert seen.tick() == []
    CircuitBreaker("newcomer", redis=redis_url, key_ttl=600).call(lambda: None)
    assert [r["name"] for u in seen.tick() for r in u["rows"]] == ["newcomer"]
    seen.client.set("distbreaker:v2:{bad\tname}:cb", "x", px=60_000)  # not a valid name
    foreign = [r for u in seen.tick() for r in u["rows"]]
    assert [r["name"] for r in foreign] == ["bad\tname"] and "foreign key" in foreign[0]["error"]
    seen.client.delete("distbreaker:v2:{bad\tname}:cb")
    assert [u["removed"] for u in seen.tick()] == [["bad\tname"]]
    seen.client.delete(*seen.client.keys("distbreaker:v2:{tenant:3}*"))
    gone = [u for u in seen.tick() if u["removed"]]
    assert gone and gone[0]["removed"] == ["tenant:3"] and "tenant:3" not in seen.rows()
    breakers[9].transition_to_forced_open("drill", "ops")   # a transition: read at once
    moved = seen.tick(moved={"tenant:9"})
    assert moved[0]["rows"][0]["state"] == "FORCED_OPEN"


def test_rate_limiters_workers_and_time_window_latency(redis_url: str) -> None:
    limiter = RateLimiter("partner-api", redis=redis_url, limit_for_period=1000,
                          limit_refresh_period=1, key_ttl=600)
    first = CircuitBreaker("search", redis=redis_url, sliding_window_type="TIME_BASED",
                           sliding_window_size=30, key_ttl=600)
    second = CircuitBreaker("search", redis=redis_url, sliding_window_type="TIME_BASED",
                            sliding_window_size=30, key_ttl=600)   # another worker instance
    for _ in range(5):
        limiter.acquire()
        first.call(lambda: time.sleep(0.03))
    second.call(lambda: None)
    seen = Recorder(redis_url)
    seen.tick(whole=True)
    for _ in range(10):
        limiter.acquire()
    seen.tick(wait=True)
    rows = seen.rows()
    rl = rows["partner-api"]
    assert rl["rate_limiter"]["limit_for_period"] == 1000
    assert rl["rate_limiter"]["calls"] == 15 and rl["rl_rates"]["permits"] > 0
    search = rows["search"]
    assert search["breaker"]["workers"] == 2
    latency = search["latency"]
    assert latency["per"] == "second" and latency["calls"] == 6
    assert 0 <= latency["p50_ms"] <= latency["p99_ms"] and latency["p99_ms"] >= 25

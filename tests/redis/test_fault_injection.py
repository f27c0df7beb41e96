"""Fleet-wide fault injection against a real redis-server: only allowing breakers obey,
injected outcomes are marked, every injection ends by itself, and the CLI refuses what
no worker would obey (docs/guides/fault_injection.md)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis

from distbreaker import InjectedFault, InjectedRejection, State
from distbreaker import inject as faults
from distbreaker._runtime.fault_feed import FEEDS
from distbreaker._runtime.faults import fault_keys
from distbreaker._runtime.keys import DEFAULT_PREFIX
from tests.helpers.cli import FAST, run
from tests.helpers.flavours import Flavour
from tests.helpers.waiting import wait_until

ALLOW = {**FAST, "allow_fault_injection": True, "minimum_number_of_calls": 1000,
         "sliding_window_size": 1000}


def registered(client: redis.Redis, name: str) -> bool:
    return name in faults.in_force(client, DEFAULT_PREFIX)[2]


def injected(client: redis.Redis, *args: str, **kwargs: Any) -> dict[str, Any]:
    """Inject, then wait for this process's feed to hold it (pub/sub makes that quick; a
    read that was under way when the injection was set does not count)."""
    result = faults.inject(client, DEFAULT_PREFIX, *args, **kwargs)

    def held() -> bool:  # by every feed of a breaker it covers (sync and asyncio have theirs)
        feeds = [feed for feed in FEEDS.feeds()
                 if faults.covered(dict.fromkeys(feed._names, 0), result["selector"])]
        return bool(feeds) and all(
            any(f.selector == result["selector"] and f.kind == result["kind"]
                for f in feed.table.faults()) for feed in feeds)

    wait_until(held, what="the feed re-read the injections")
    return result


def test_an_injected_error_replaces_the_call_and_counts_as_a_failure(
        flavour: Flavour, redis_url: str, redis_client: redis.Redis, name: str) -> None:
    breaker = flavour.breaker(name, redis=redis_url, **ALLOW)
    seen: list[Any] = []
    breaker.add_listener(seen.append, "*")
    assert breaker.call(lambda: "ok") == "ok"
    wait_until(lambda: registered(redis_client, name), what="the breaker registered")
    injected(redis_client, name, "error", status=502, for_=60, actor="alice",
             reason="game day")
    ran: list[int] = []
    with pytest.raises(InjectedFault) as caught:
        breaker.call(lambda: ran.append(1))
    assert ran == [] and caught.value.status_code == 502 and caught.value.actor == "alice"
    assert breaker.metrics().failed == 1  # the breaker counted it like the failure it stands for
    marked = [e for e in seen if e.kind == "fault_injected"]
    assert marked and isinstance(marked[0].error, InjectedFault)
    assert any(e.kind == "error" and isinstance(e.error, InjectedFault) for e in seen)
    assert faults.stop(redis_client, DEFAULT_PREFIX, name, actor="alice", reason="done") == 1
    wait_until(lambda: _passes(breaker), what="the call runs again once the injection ended")


def _passes(breaker: Any) -> bool:
    try:
        return breaker.call(lambda: "ok") == "ok"
    except InjectedFault:
        return False


def test_an_injected_rejection_is_a_marked_call_not_permitted_and_the_state_stays(
        flavour: Flavour, redis_url: str, redis_client: redis.Redis, name: str) -> None:
    breaker = flavour.breaker(name, redis=redis_url, **ALLOW)
    breaker.call(lambda: "ok")
    wait_until(lambda: registered(redis_client, name), what="the breaker registered")
    injected(redis_client, name.replace("-", "?"), "reject", for_=60, actor="bob")
    with pytest.raises(InjectedRejection) as caught:
        breaker.call(lambda: "never")
    assert caught.value.actor == "bob" and "fault injection" in caught.value.reason
    assert breaker.state is State.CLOSED  # the fleet's state is untouched
    assert breaker.local_counts().rejections["INJECTED"] == 1


def test_injected_latency_delays_the_call_which_still_runs(
        flavour: Flavour, redis_url: str, redis_client: redis.Redis, name: str) -> None:
    breaker = flavour.breaker(name, redis=redis_url, **ALLOW)
    breaker.call(lambda: "ok")
    wait_until(lambda: registered(redis_client, name), what="the breaker registered")
    injected(redis_client, name, "latency", latency=0.3, for_=60)
    started = time.monotonic()
    assert breaker.call(lambda: "slow ok") == "slow ok"
    assert time.monotonic() - started >= 0.3


def test_a_breaker_that_does_not_allow_injection_never_obeys(
        flavour: Flavour, redis_url: str, redis_client: redis.Redis, name: str) -> None:
    allowing = flavour.breaker(name + "-yes", redis=redis_url, **ALLOW)
    plain = flavour.breaker(name + "-no", redis=redis_url, **FAST)
    allowing.call(lambda: "ok")
    wait_until(lambda: registered(redis_client, name + "-yes"), what="registered")
    result = injected(redis_client, name + "-*", "error", status=503, for_=60)
    assert result["names"] == [name + "-yes"]  # only the allowing name registered
    assert [plain.call(lambda: "ok") for _ in range(20)] == ["ok"] * 20
    with pytest.raises(InjectedFault):
        allowing.call(lambda: "never")


def test_the_policy_retries_an_injected_503_and_records_each_attempt(
        flavour: Flavour, redis_url: str, redis_client: redis.Redis, name: str) -> None:
    policy = flavour.policy(name, redis=redis_url, breaker=ALLOW,
                            retry={"max_attempts": 3, "base": 0.0, "cap": 0.0})
    assert policy.call(lambda: "ok") == "ok"
    wait_until(lambda: registered(redis_client, name), what="registered")
    injected(redis_client, name, "error", status=503, for_=60)
    ran: list[int] = []
    with pytest.raises(InjectedFault):
        policy.call(lambda: ran.append(1))
    assert ran == []
    assert policy.breaker.metrics().failed == 3  # each attempt failed, none reached the call


def test_injection_is_refused_unless_a_running_worker_allows_it_and_always_ends(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    with pytest.raises(faults.NotAllowed, match="allow_fault_injection"):
        faults.inject(redis_client, DEFAULT_PREFIX, name, "reject", for_=60)
    assert run(redis_url, "inject", name, "--reject", "--for", "1m").exit_code == 1
    with pytest.raises(ValueError, match="--for"):
        faults.inject(redis_client, DEFAULT_PREFIX, name, "reject", for_=30 * 86400,
                      require_allowed=False)
    stored = faults.inject(redis_client, DEFAULT_PREFIX, name, "reject", for_=0.5,
                           require_allowed=False)
    assert stored["names"] == []
    assert faults.in_force(redis_client, DEFAULT_PREFIX)[1]
    wait_until(lambda: not faults.in_force(redis_client, DEFAULT_PREFIX)[1],
               what="the injection ended by itself")
    assert redis_client.pttl(fault_keys(DEFAULT_PREFIX)[1]) > 0


def test_the_cli_sets_lists_ends_and_logs_injections(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    from distbreaker import CircuitBreaker

    breaker = CircuitBreaker(name, redis=redis_url, **ALLOW)
    breaker.call(lambda: "ok")
    wait_until(lambda: registered(redis_client, name), what="registered")
    for args in (["--error", "503", "--rate", "5%"], ["--latency", "200ms"]):
        done = run(redis_url, "inject", name, *args, "--for", "10m", "--reason", "drill",
                   "--actor", "carol")
        assert done.exit_code == 0, done.output
        assert f"workers allowing it: {name}" in done.output
    listed = json.loads(run(redis_url, "inject", "--list", "--json").output)
    kinds = {(i["kind"], i["rate"], i["status"], i["latency_s"]) for i in listed["injections"]}
    assert kinds == {("error", 0.05, 503, None), ("latency", 1.0, None, 0.2)}
    assert name in listed["allowing"]
    assert "ended 1 injection" in run(redis_url, "inject", "--off", name, "--kind",
                                              "latency").output
    assert "ended 1 injection" in run(redis_url, "inject", "--off-all").output
    log = json.loads(run(redis_url, "inject", "--history", "--json").output)
    assert [(e["op"], e["kind"]) for e in log] == [
        ("set", "error"), ("set", "latency"), ("off", "latency"), ("off", "")]
    assert {e["reason"] for e in log[:2]} == {"drill"} and log[0]["actor"] == "carol"
    for bad in (["inject", name, "--for", "1m"], ["inject", name, "--reject"],
                ["inject", name, "--reject", "--error", "503", "--for", "1m"],
                ["inject", name, "--reject", "--rate", "120%", "--for", "1m"]):
        assert run(redis_url, *bad).exit_code == 2, bad
    breaker.close()


def test_the_registry_allows_injection_per_breaker_and_metrics_mark_injected_rejections(
        redis_url: str, redis_client: redis.Redis, name: str) -> None:
    from prometheus_client import CollectorRegistry

    from distbreaker import Registry
    from distbreaker.contrib.prometheus import DistbreakerCollector

    registry = Registry.from_dict({"breakers": {"instances": {
        name: {"allow_fault_injection": True, "redis_timeout": 5.0},
        name + "-other": {"redis_timeout": 5.0}}}}, redis=redis_url, environ={})
    breaker = registry.breaker(name)
    assert breaker.config.allow_fault_injection
    assert not registry.breaker(name + "-other").config.allow_fault_injection
    breaker.call(lambda: "ok")
    wait_until(lambda: registered(redis_client, name), what="registered")
    injected(redis_client, name, "reject", for_=60)
    with pytest.raises(InjectedRejection):
        breaker.call(lambda: "never")
    prometheus = CollectorRegistry()
    prometheus.register(DistbreakerCollector(redis_url, components=[breaker]))
    assert prometheus.get_sample_value("distbreaker_rejections_total",
                                       {"name": name, "reason": "injected"}) == 1
    assert prometheus.get_sample_value("distbreaker_rejections_total",
                                       {"name": name, "reason": "open"}) == 0
    assert prometheus.get_sample_value("distbreaker_injected_faults_total",
                                       {"name": name, "kind": "reject"}) == 1
    registry.close()

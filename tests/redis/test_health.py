"""Health reports: readiness fails only for critical components this process cannot serve
(or, opted in, that are OPEN); Redis and fallback status."""

from __future__ import annotations

import asyncio

import pytest

import distbreaker.aio
from distbreaker import CallNotPermitted, CircuitBreaker, Registry, health

CONFIG = {
    "breakers": {"instances": {
        "payments": {"critical": True},
        "recommendations": {},
        "ledger": {"critical": True, "on_redis_error": "fail_closed"},
        "audit": {"fail_readiness_when_open": True},
    }},
    "bulkheads": {"instances": {"payments": {"max_concurrent_calls": 3, "critical": True},
                                "exports": {"fallback_limit": 0, "critical": True}}},
    "budgets": {"instances": {"payments": {}}},
    "policies": {"instances": {"checkout": {"breaker": "payments", "bulkhead": "payments",
                                            "budget": "payments", "critical": True}}},
}


def test_an_optional_dependency_open_keeps_the_service_ready(redis_url: str) -> None:
    registry = Registry.from_dict(CONFIG, redis=redis_url, environ={})
    registry.breaker("recommendations").trip("upstream down")
    report = registry.health()
    assert report.redis_reachable
    assert report.ready and report.live
    by_name = {f"{c.kind}:{c.name}": c for c in report.components}
    optional = by_name["breaker:recommendations"]
    assert (optional.ok, optional.state, optional.critical) == (False, "OPEN", False)
    assert by_name["breaker:payments"].ok and by_name["breaker:payments"].critical
    assert by_name["policy:checkout"].ok
    assert report.to_dict()["status"] == "UP"


def test_a_critical_dependency_open_keeps_readiness(redis_url: str) -> None:
    """OPEN is a fleet state: failing readiness on it would drop every pod at once."""
    registry = Registry.from_dict(CONFIG, redis=redis_url, environ={})
    registry.breaker("payments").trip("upstream down")
    registry.breaker("ledger").transition_to_forced_open("maintenance")
    report = registry.health()
    assert report.ready and report.live
    assert report.failing == ()
    checkout = next(c for c in report.components if c.name == "checkout")
    assert (checkout.state, checkout.ok, checkout.serving) == ("OPEN", False, True)
    assert [p.kind for p in checkout.parts] == ["breaker", "bulkhead", "budget"]
    assert report.to_dict()["status"] == "UP"


def test_failing_readiness_on_open_is_opt_in(redis_url: str) -> None:
    registry = Registry.from_dict(CONFIG, redis=redis_url, environ={})
    assert registry.critical("breaker", "audit")          # the opt-in implies critical
    registry.breaker("audit").trip("upstream down")
    report = registry.health()
    assert not report.ready and report.live
    payload = report.to_dict()
    assert (payload["status"], payload["failing"]) == ("DOWN", ["breaker:audit"])
    assert payload["components"]["breaker:audit"]["fail_readiness_when_open"] is True
    env = {"DISTBREAKER_BREAKER_PAYMENTS_FAIL_READINESS_WHEN_OPEN": "true"}
    registry = Registry.from_dict(CONFIG, redis=redis_url, environ=env)
    registry.breaker("payments")
    assert [c.name for c in registry.health().failing] == ["audit"]    # still OPEN (shared)
    registry.breaker("payments").trip("upstream down")
    assert {f"{c.kind}:{c.name}" for c in registry.health().failing} == {
        "breaker:audit", "breaker:payments"}


def test_overrides_are_reported(redis_url: str) -> None:
    registry = Registry.from_dict(CONFIG, redis=redis_url, environ={})
    registry.breaker("payments").transition_to_disabled("incident 42")
    registry.breaker("recommendations").transition_to_forced_open("maintenance")
    report = {c.name: c for c in registry.health().components if c.kind == "breaker"}
    assert (report["payments"].ok, report["payments"].override) == (True, "DISABLED")
    assert (report["recommendations"].ok, report["recommendations"].override) == (
        False, "FORCED_OPEN")
    assert report["ledger"].override is None


def test_redis_unreachable_fail_open_is_ready_fail_closed_is_not(dead_redis_url: str) -> None:
    registry = Registry.from_dict(CONFIG, redis=dead_redis_url, environ={})
    assert registry.breaker("payments").call(lambda: "served locally") == "served locally"
    with pytest.raises(CallNotPermitted):
        registry.breaker("ledger").call(lambda: "never")
    registry.budget("payments").balance()
    report = registry.health()
    assert not report.redis_reachable
    by_name = {f"{c.kind}:{c.name}": c for c in report.components}
    payments = by_name["breaker:payments"]
    assert (payments.ok, payments.redis_reachable, payments.local_fallback_active) == (
        True, False, True)
    ledger = by_name["breaker:ledger"]
    assert (ledger.ok, ledger.redis_reachable, ledger.local_fallback_active) == (
        False, False, False)
    assert "ConnectionError" in (ledger.error or "")
    budget = by_name["budget:payments"]
    assert (budget.ok, budget.redis_reachable, budget.local_fallback_active) == (
        True, False, True)
    assert by_name["bulkhead:payments"].ok            # the local limit serves
    assert not by_name["bulkhead:exports"].ok         # fallback_limit 0 rejects everything
    assert {f"{c.kind}:{c.name}" for c in report.failing} == {"breaker:ledger",
                                                              "bulkhead:exports"}


def test_health_of_one_component(redis_url: str, name: str) -> None:
    breaker = CircuitBreaker(name, redis=redis_url)
    report = health(breaker)
    assert (report.kind, report.name, report.ok, report.state) == ("breaker", name, True,
                                                                   "CLOSED")
    breaker.trip()
    assert health(breaker, critical=True).to_dict()["status"] == "DOWN"


def test_asyncio_health(redis_url: str, name: str) -> None:
    registry = distbreaker.aio.Registry.from_dict(CONFIG, redis=redis_url, environ={})

    async def main() -> tuple[bool, bool, str | None]:
        await registry.breaker("payments").trip()
        report = await registry.health()
        single = await distbreaker.aio.health(registry.breaker("recommendations"))
        await registry.aclose()
        return report.ready, single.ok, single.state

    assert asyncio.run(main()) == (True, True, "CLOSED")


def test_a_pool_is_in_the_registrys_health_and_panic_is_not_ok(redis_url: str,
                                                               name: str) -> None:
    registry = Registry.from_dict({"pools": {"instances": {name: {
        "members": ["a:80", "b:80"], "consecutive_5xx": 1, "max_ejection_percent": 100,
        "healthy_panic_threshold": 50, "redis_timeout": 5.0}}}}, redis=redis_url, environ={})
    pool = registry.pool(name)
    report = registry.health()
    entry = next(c for c in report.components if c.kind == "pool")
    assert (entry.name, entry.ok, entry.serving) == (name, True, True)
    assert entry.details == {"members": 2, "ejected": 0, "panic": False}  # not used yet
    pool.release(pool.pick())  # the first pick puts the members in Redis
    for member in ("a:80", "b:80"):
        pool.eject(member, 60)
    entry = next(c for c in registry.health().components if c.kind == "pool")
    assert entry.details["panic"] and entry.state == "PANIC" and not entry.ok
    assert entry.serving and registry.health().ready  # picks go to every member: serving
    registry.close()

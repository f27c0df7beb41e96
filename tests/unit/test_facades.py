"""`distbreaker` and `distbreaker.aio` export the same names: the flavour-independent ones
as the very same objects, the components each in its own flavour."""

from __future__ import annotations

import inspect

import distbreaker
import distbreaker.aio as aio

#: Names exported by one facade only, with the reason. None today: every component has
#: a sync and an asyncio flavour, and every other name is flavour-independent.
ONLY_SYNC: dict[str, str] = {}
ONLY_AIO: dict[str, str] = {}

#: The names each facade exports in its own flavour, with a method that does Redis I/O.
COMPONENTS = {"Bulkhead": "call", "CircuitBreaker": "call", "GaneshaBreaker": "call",
              "Policy": "call", "Pool": "pick", "RateLimiter": "acquire", "Retry": "call",
              "RetryBudget": "try_withdraw"}
#: Components holding Redis clients or batched state: close() (sync), aclose() (asyncio).
CLOSABLE = {"Bulkhead", "CircuitBreaker", "GaneshaBreaker", "Pool", "RateLimiter",
            "RetryBudget"}
#: Not components, but with a flavour of their own: the registry builds the flavour's
#: components, health() reads them (awaited in asyncio).
FLAVOURED = {"Registry", "health"}


def test_both_facades_export_the_same_names() -> None:
    sync_names, aio_names = set(distbreaker.__all__), set(aio.__all__)
    assert sync_names - aio_names == set(ONLY_SYNC)
    assert aio_names - sync_names == set(ONLY_AIO)
    assert len(distbreaker.__all__) == len(sync_names)   # no name listed twice
    assert len(aio.__all__) == len(aio_names)


def test_every_exported_name_exists() -> None:
    for module in (distbreaker, aio):
        missing = [name for name in module.__all__ if not hasattr(module, name)]
        assert missing == [], module.__name__


def test_flavour_independent_names_are_the_same_objects() -> None:
    shared = set(distbreaker.__all__) & set(aio.__all__) - set(COMPONENTS) - FLAVOURED
    assert {"BudgetConfig", "RetryConfig", "Jitter", "RetryBudgetExhausted", "SchemaError",
            "GaneshaConfig", "BreakerMetrics", "BulkheadMetrics", "State", "Transition",
            "classify_http", "after_fork"} <= shared
    different = [name for name in shared if getattr(distbreaker, name) is not getattr(aio, name)]
    assert different == []


def test_the_registry_and_health_have_a_flavour_each() -> None:
    assert distbreaker.Registry is not aio.Registry
    assert not inspect.iscoroutinefunction(distbreaker.health)
    assert inspect.iscoroutinefunction(aio.health)


def test_each_component_has_a_sync_and_an_asyncio_flavour() -> None:
    assert set(distbreaker.__all__) >= set(COMPONENTS)
    for name, method in COMPONENTS.items():
        sync_cls, aio_cls = getattr(distbreaker, name), getattr(aio, name)
        assert sync_cls is not aio_cls
        assert not inspect.iscoroutinefunction(getattr(sync_cls, method)), name
        assert inspect.iscoroutinefunction(getattr(aio_cls, method)), name


def test_components_holding_resources_close_in_their_flavour() -> None:
    for name in CLOSABLE:
        sync_cls, aio_cls = getattr(distbreaker, name), getattr(aio, name)
        assert callable(sync_cls.close) and not inspect.iscoroutinefunction(sync_cls.close)
        assert inspect.iscoroutinefunction(aio_cls.aclose), name


def test_ganesha_package_keeps_its_names() -> None:
    from distbreaker.ganesha import GaneshaBreaker, GaneshaConfig

    assert GaneshaBreaker is distbreaker.GaneshaBreaker
    assert GaneshaConfig is aio.GaneshaConfig

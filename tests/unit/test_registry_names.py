"""Configuration names (issue 29, item 6): DISTBREAKER_* variables that look like ours but
name nothing are errors naming the nearest valid variable; DISTBREAKER_<KIND>_DEFAULT_...
overrides the base config; a policy's `retry` from the environment is JSON; the registry's
Redis URL falls back to DISTBREAKER_REDIS_URL then REDIS_URL; Resilience4j's camelCase and
kebab-case names are aliases, anything else gets a "did you mean"."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest

from distbreaker import CircuitBreaker, Registry
from distbreaker.registry.config import RegistryConfigError, RegistrySpec

FILE = {"breakers": {"configs": {"default": {"minimum_number_of_calls": 10}},
                     "instances": {"payments": {}, "search": {}}},
        "policies": {"instances": {"checkout": {"breaker": "payments"}}}}


def _registry(data: dict[str, Any], environ: dict[str, str]) -> Registry:
    return Registry.from_dict(data, redis=fakeredis.FakeRedis(), environ=environ)


@pytest.mark.parametrize(("variable", "meant"), [
    ("DISTBREAKER_BREAKER_PAYMNTS_MINIMUM_NUMBER_OF_CALLS",       # a typo in the name
     "DISTBREAKER_BREAKER_PAYMENTS_MINIMUM_NUMBER_OF_CALLS"),
    ("DISTBREAKER_BREAKER_PAYMENTS_MINIMUM_CALLS",                # in the setting
     "DISTBREAKER_BREAKER_PAYMENTS_MINIMUM_NUMBER_OF_CALLS"),
    ("DISTBREAKER_BREAKERS_PAYMENTS_MINIMUM_NUMBER_OF_CALLS",     # in the kind
     "DISTBREAKER_BREAKER_PAYMENTS_MINIMUM_NUMBER_OF_CALLS"),
    ("DISTBREAKER_BRAEKER_SEARCH_SLOW_CALL_DURATION",
     "DISTBREAKER_BREAKER_SEARCH_SLOW_CALL_DURATION"),
])
def test_a_variable_that_looks_like_ours_names_the_nearest_valid_one(variable: str,
                                                                      meant: str) -> None:
    with pytest.raises(RegistryConfigError) as caught:
        _registry(FILE, {variable: "4"})
    assert variable in str(caught.value)
    assert f"did you mean {meant}?" in str(caught.value)


def test_variables_that_are_not_component_settings_are_left_alone() -> None:
    env = {"DISTBREAKER_REDIS_URL": "redis://elsewhere:6379/0", "DISTBREAKER_REGISTRY": "x.yaml",
           "DISTBREAKER_CELERY_REDIS": "redis://", "DISTBREAKER_MYAPP_MODE": "blue",
           "DISTBREAKER_BREAKER_LLM_MINIMUM_NUMBER_OF_CALLS": "3"}  # undeclared, not a typo
    registry = _registry(FILE, env)
    assert registry.breaker("llm").config.minimum_number_of_calls == 3


def test_default_overrides_the_base_config_from_the_environment() -> None:
    env = {"DISTBREAKER_BREAKER_DEFAULT_MINIMUM_NUMBER_OF_CALLS": "3",
           "DISTBREAKER_BREAKER_DEFAULT_WAIT_DURATION_IN_OPEN_STATE": "1m30s"}
    registry = _registry(FILE, env)
    for name in ("payments", "search", "not-in-the-file"):
        config = registry.breaker(name).config
        assert (config.minimum_number_of_calls, config.wait_duration_in_open_state) == (3, 90)
    bare = _registry({}, {"DISTBREAKER_BULKHEAD_DEFAULT_MAX_CONCURRENT_CALLS": "7"})
    assert bare.bulkhead("any").config.max_concurrent_calls == 7   # no configs.default in file


def test_a_policys_retry_from_the_environment_is_json() -> None:
    env = {"DISTBREAKER_POLICY_CHECKOUT_RETRY": '{"max_attempts": 5, "cap": "PT2S"}'}
    policy = _registry(FILE, env).policy("checkout")
    assert (policy.retry.config.max_attempts, policy.retry.config.cap) == (5, 2.0)
    with pytest.raises(RegistryConfigError, match="retry"):
        _registry(FILE, {"DISTBREAKER_POLICY_CHECKOUT_RETRY": '{"max_attempts": '})


def test_the_redis_url_comes_from_the_file_then_the_environment() -> None:
    both = {"DISTBREAKER_REDIS_URL": "redis://a:1/0", "REDIS_URL": "redis://b:2/0"}
    assert RegistrySpec({}, environ=both).redis == "redis://a:1/0"
    assert RegistrySpec({}, environ={"REDIS_URL": "redis://b:2/0"}).redis == "redis://b:2/0"
    assert RegistrySpec({"redis": "redis://c:3/0"}, environ=both).redis == "redis://c:3/0"
    assert RegistrySpec({}, environ={}).redis is None                 # localhost, as before


def test_resilience4j_names_are_aliases() -> None:
    spec = RegistrySpec({"breakers": {"instances": {"a": {
        "slowCallDurationThreshold": "PT5S", "failure-rate-threshold": 30,
        "permittedNumberOfCallsInHalfOpenState": 3, "slidingWindowSize": 20,
        "minimumNumberOfCalls": 20}}},
        "retries": {"instances": {"r": {"maxAttempts": 4, "waitDuration": "500ms",
                                        "retryExceptions": "TimeoutError"}}}}, environ={})
    breaker = spec.instances["breaker"]["a"].config
    assert (breaker.slow_call_duration, breaker.failure_rate_threshold,
            breaker.permitted_calls_in_half_open, breaker.sliding_window_size) == (5, 30, 3, 20)
    retry = spec.instances["retry"]["r"].config
    assert (retry.max_attempts, retry.base, retry.retry_on) == (4, 0.5, (TimeoutError,))


def test_unknown_names_get_a_did_you_mean() -> None:
    with pytest.raises(RegistryConfigError, match="did you mean 'failure_rate_threshold'"):
        RegistrySpec({"breakers": {"instances": {"a": {"failureRateTreshold": 30}}}},
                     environ={})
    with pytest.raises(RegistryConfigError, match="a second time"):
        RegistrySpec({"breakers": {"instances": {"a": {"slowCallDurationThreshold": 5,
                                                       "slow_call_duration": 5}}}}, environ={})
    with pytest.raises(TypeError, match="slowCallDurationThreshold -> slow_call_duration"):
        CircuitBreaker("a", redis=fakeredis.FakeRedis(), slowCallDurationThreshold=5)

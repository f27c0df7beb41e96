"""Registry configuration: file formats, durations, ${VAR}, environment overrides, errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fakeredis
import pytest

from distbreaker import (
    BreakerConfig,
    Registry,
    RegistryConfigError,
    RetryBudget,
)
from distbreaker._runtime.options import parse_duration
from distbreaker.registry.config import RegistrySpec, env_name

YAML = """\
redis: ${REDIS_URL}
breakers:
  configs:
    default: {failure_rate_threshold: 50, sliding_window_size: 20,
              wait_duration_in_open_state: 30s}
    strict: {base_config: default, failure_rate_threshold: 25, slow_call_duration: 500ms}
  instances:
    payments: {base_config: default, minimum_number_of_calls: 10, critical: true}
    search: {base_config: strict, record_exceptions: [ConnectionError, socket.timeout]}
bulkheads: {instances: {payments: {max_concurrent_calls: 25, max_wait_duration: 250ms}}}
budgets:   {instances: {payments: {percent_can_retry: 0.2, ttl: 1m}}}
retries:   {instances: {backend: {max_attempts: 4, base: 50ms, budget: payments}}}
policies:
  instances:
    payments: {breaker: payments, bulkhead: payments, budget: payments,
               retry: {max_attempts: 3}}
    search: {retry: backend}
"""

TOML = """\
redis = "${REDIS_URL}"

[breakers.configs.default]
failure_rate_threshold = 50
sliding_window_size = 20
wait_duration_in_open_state = "30s"

[breakers.configs.strict]
base_config = "default"
failure_rate_threshold = 25
slow_call_duration = "500ms"

[breakers.instances.payments]
base_config = "default"
minimum_number_of_calls = 10
critical = true

[breakers.instances.search]
base_config = "strict"
record_exceptions = ["ConnectionError", "socket.timeout"]

[bulkheads.instances.payments]
max_concurrent_calls = 25
max_wait_duration = "250ms"

[budgets.instances.payments]
percent_can_retry = 0.2
ttl = "1m"

[retries.instances.backend]
max_attempts = 4
base = "50ms"
budget = "payments"

[policies.instances.payments]
breaker = "payments"
bulkhead = "payments"
budget = "payments"
retry = { max_attempts = 3 }

[policies.instances.search]
retry = "backend"
"""

ENV = {"REDIS_URL": "redis://127.0.0.1:1/0"}


def _registry(data: dict[str, Any], environ: dict[str, str] | None = None) -> Registry:
    return Registry.from_dict(data, redis=fakeredis.FakeRedis(), environ=environ or {})


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(("value", "seconds"), [
    (30, 30.0), (0.5, 0.5), ("500ms", 0.5), ("30s", 30.0), ("5m", 300.0), ("1h", 3600.0),
    ("2.5", 2.5), (" 10 s ", 10.0), (".5s", 0.5), ("1d", 86400.0), ("1m30s", 90.0),
    ("PT30S", 30.0), ("P1DT1H", 90000.0)])
def test_durations_are_seconds_or_strings_with_a_unit(value: Any, seconds: float) -> None:
    assert parse_duration(value, "wait") == seconds


@pytest.mark.parametrize("value", ["5 minutes", "ms", "-1s", "1m30", "PT", "", True, [1]])
def test_bad_durations_name_the_field(value: Any) -> None:
    with pytest.raises(ValueError, match="wait"):
        parse_duration(value, "wait")


@pytest.mark.parametrize(("name", "text"), [("resilience.yaml", YAML),
                                            ("resilience.toml", TOML)])
def test_yaml_and_toml_files_build_the_same_components(tmp_path: Path, name: str,
                                                       text: str) -> None:
    registry = Registry.from_file(_write(tmp_path, name, text), redis=fakeredis.FakeRedis(),
                                  environ=ENV)
    assert registry.spec.redis == "redis://127.0.0.1:1/0"
    payments = registry.breaker("payments")
    assert payments.config == BreakerConfig(
        failure_rate_threshold=50, sliding_window_size=20, wait_duration_in_open_state=30,
        minimum_number_of_calls=10)
    assert registry.critical("breaker", "payments")
    search = registry.breaker("search").config
    assert (search.failure_rate_threshold, search.slow_call_duration,
            search.wait_duration_in_open_state) == (25, 0.5, 30)
    import socket
    assert search.record_exceptions == (ConnectionError, socket.timeout)
    assert registry.bulkhead("payments").config.max_wait_duration == 0.25
    assert registry.budget("payments").config.ttl == 60
    backend = registry.retry("backend")
    assert (backend.config.max_attempts, backend.config.base) == (4, 0.05)
    assert backend.budget is registry.budget("payments")
    policy = registry.policy("payments")
    assert policy.breaker is payments
    assert policy.bulkhead is registry.bulkhead("payments")
    assert policy.budget is registry.budget("payments")
    assert policy.retry.config.max_attempts == 3
    assert registry.policy("search").retry is backend
    assert registry.policy("search").breaker is registry.breaker("search")
    assert registry.policy("search").bulkhead is None


def test_one_instance_per_name_and_one_client(tmp_path: Path) -> None:
    client = fakeredis.FakeRedis()
    registry = Registry.from_file(_write(tmp_path, "r.yaml", YAML), redis=client, environ=ENV)
    assert registry.breaker("payments") is registry.breaker("payments")
    assert registry.policy("payments") is registry.policy("payments")
    assert registry.client is client
    for component in (registry.breaker("payments"), registry.bulkhead("payments"),
                      registry.budget("payments"), registry.breaker("undeclared")):
        assert component._client is client


def test_keyed_instances_share_config_and_client_not_state_names() -> None:
    registry = _registry({"breakers": {"instances": {"llm": {"minimum_number_of_calls": 5}}},
                          "bulkheads": {"instances": {"llm": {"max_concurrent_calls": 2}}},
                          "policies": {"instances": {"llm": {"bulkhead": "llm"}}}})
    a, b = registry.breaker("llm", key="tenant-a"), registry.breaker("llm", key="tenant-b")
    assert (a.name, b.name) == ("llm:tenant-a", "llm:tenant-b")
    assert a is registry.breaker("llm", key="tenant-a")
    assert a is not registry.breaker("llm")
    assert a.config == b.config == registry.breaker("llm").config
    assert a._client is b._client is registry.client
    policy = registry.policy("llm", key="tenant-a")
    assert policy.name == "llm:tenant-a"
    assert policy.breaker is a
    assert policy.bulkhead is registry.bulkhead("llm", key="tenant-a")


def test_keyed_instances_are_bounded_per_kind() -> None:
    registry = _registry({"max_keyed": 3})
    first = registry.breaker("llm", key=0)
    for key in range(1, 4):
        registry.breaker("llm", key=key)
    assert registry.breaker("llm", key=0) is not first      # dropped, rebuilt on demand
    assert registry.breaker("llm", key=3) is registry.breaker("llm", key=3)


def test_default_config_is_the_base_of_undeclared_names_and_instances() -> None:
    registry = _registry({"breakers": {"configs": {"default": {"minimum_number_of_calls": 7}},
                                       "instances": {"a": {"sliding_window_size": 50}}}})
    assert registry.breaker("a").config.minimum_number_of_calls == 7
    assert registry.breaker("a").config.sliding_window_size == 50
    assert registry.breaker("not-in-the-file").config.minimum_number_of_calls == 7
    assert registry.bulkhead("x").config == registry.bulkhead("y").config  # library defaults


def test_environment_overrides_the_file() -> None:
    environ = {"DISTBREAKER_BREAKER_PAYMENTS_MINIMUM_NUMBER_OF_CALLS": "4",
               "DISTBREAKER_BREAKER_PAYMENTS_WAIT_DURATION_IN_OPEN_STATE": "2m",
               "DISTBREAKER_BREAKER_LLM_API_SLOW_CALL_DURATION": "750ms",
               "DISTBREAKER_BULKHEAD_PAYMENTS_MAX_CONCURRENT_CALLS": "9",
               "DISTBREAKER_BUDGET_PAYMENTS_PERCENT_CAN_RETRY": "0.5",
               "DISTBREAKER_RETRY_BACKEND_MAX_ATTEMPTS": "6",
               "DISTBREAKER_BREAKER_PAYMENTS_CRITICAL": "false",
               "DISTBREAKER_BREAKER_PAYMENTS_RECORD_EXCEPTIONS": "TimeoutError,OSError",
               "DISTBREAKER_CELERY_REDIS": "not ours", "OTHER": "x"}
    registry = _registry({
        "breakers": {"instances": {"payments": {"minimum_number_of_calls": 10,
                                                "critical": True}}},
        "bulkheads": {"instances": {"payments": {"max_concurrent_calls": 25}}},
        "budgets": {"instances": {"payments": {}}},
        "retries": {"instances": {"backend": {"max_attempts": 2}}}}, environ)
    payments = registry.breaker("payments").config
    assert payments.minimum_number_of_calls == 4
    assert payments.wait_duration_in_open_state == 120
    assert payments.record_exceptions == (TimeoutError, OSError)
    assert not registry.critical("breaker", "payments")
    assert registry.breaker("llm-api").config.slow_call_duration == 0.75  # '-' as '_'
    assert registry.bulkhead("payments").config.max_concurrent_calls == 9
    assert registry.budget("payments").config.percent_can_retry == 0.5
    assert registry.retry("backend").config.max_attempts == 6
    assert env_name("llm-api.v2") == "LLM_API_V2"


def test_env_variable_naming_no_setting_is_an_error() -> None:
    with pytest.raises(RegistryConfigError) as caught:
        _registry({}, {"DISTBREAKER_BREAKER_PAYMENTS_MINIMUM_CALLS": "4"})
    assert "DISTBREAKER_BREAKER_PAYMENTS_MINIMUM_CALLS" in str(caught.value)
    assert "names no breaker setting" in str(caught.value)


def test_bad_env_value_names_the_variable_and_field() -> None:
    with pytest.raises(RegistryConfigError) as caught:
        _registry({}, {"DISTBREAKER_BREAKER_PAYMENTS_MINIMUM_NUMBER_OF_CALLS": "four"})
    error = caught.value
    assert error.field == "minimum_number_of_calls"
    assert "DISTBREAKER_BREAKER_PAYMENTS_MINIMUM_NUMBER_OF_CALLS" in str(error)


def test_redis_url_is_expanded_with_defaults(tmp_path: Path) -> None:
    spec = RegistrySpec({"redis": "${REDIS_URL:-memory://}", "prefix": "${P}"},
                        environ={"P": "myapp"})
    assert (spec.redis, spec.prefix) == ("memory://", "myapp")
    path = _write(tmp_path, "r.yaml", "redis: ${NOT_SET_ANYWHERE}\n")
    with pytest.raises(RegistryConfigError) as caught:
        Registry.from_file(path, environ={})
    assert str(path) in str(caught.value)
    assert "NOT_SET_ANYWHERE is not set" in str(caught.value)


@pytest.mark.parametrize(("text", "path", "field", "problem"), [
    ("breakers: {instances: {payments: {minimum_number_of_calls: lots}}}",
     "breakers.instances.payments", "minimum_number_of_calls", "must be an integer"),
    ("breakers: {instances: {payments: {minimum_number_of_calls: 0}}}",
     "breakers.instances.payments", "minimum_number_of_calls", "must be in"),
    ("breakers: {instances: {payments: {wait_duration_in_open_state: soon}}}",
     "breakers.instances.payments", "wait_duration_in_open_state", "must be a duration"),
    ("breakers: {instances: {payments: {failure_rate: 50}}}",
     "breakers.instances.payments", "failure_rate", "unknown breaker setting"),
    ("breakers: {instances: {payments: {base_config: nope}}}",
     "breakers.instances.payments", "base_config", "no breakers.configs.nope"),
    ("breakers: {configs: {a: {base_config: b}, b: {base_config: a}}}",
     "breakers.configs.b", "base_config", "cycle: a -> b -> a"),
    ("breakers: {configs: {default: {key_ttl: 1}}}",
     "breakers.configs.default", "key_ttl", "must be >="),
    ("breakers: {instances: {payments: {record_exceptions: [no.such.Error]}}}",
     "breakers.instances.payments", "record_exceptions", "cannot import 'no.such.Error'"),
    ("bulkheads: {instances: {payments: {max_concurrent_calls: -1}}}",
     "bulkheads.instances.payments", "max_concurrent_calls", "must be in"),
    ("budgets: {instances: {payments: {ttl: 0}}}",
     "budgets.instances.payments", "ttl", "must be in"),
    ("retries: {instances: {r: {budget: missing}}}",
     "retries.instances.r", "budget", "no budgets.instances.missing"),
    ("policies: {instances: {payments: {bulkhead: missing}}}",
     "policies.instances.payments", "bulkhead", "no bulkheads.instances.missing"),
    ("policies: {instances: {payments: {retry: {max_attempts: 0}}}}",
     "policies.instances.payments.retry", "max_attempts", "must be in"),
    ("policies: {instances: {payments: {fallback: nowhere.fallback}}}",
     "policies.instances.payments", "fallback", "cannot import"),
    ("breakers: {instance: {}}", "breakers.instance", None, "unknown key"),
    ("breaker: {}", "breaker", None, "unknown section"),
])
def test_every_error_names_the_file_the_instance_and_the_field(
        tmp_path: Path, text: str, path: str, field: str | None, problem: str) -> None:
    file = _write(tmp_path, "resilience.yaml", text + "\n")
    with pytest.raises(RegistryConfigError) as caught:
        Registry.from_file(file, redis=fakeredis.FakeRedis(), environ={})
    error = caught.value
    assert (error.source, error.path, error.field) == (str(file), path, field)
    assert problem in str(error)
    assert str(error).startswith(f"{file}: {path}")


def test_errors_in_toml_name_the_file(tmp_path: Path) -> None:
    file = _write(tmp_path, "r.toml", "[budgets.instances.payments]\npercent_can_retry = 99\n")
    with pytest.raises(RegistryConfigError, match=r"r\.toml: budgets\.instances\.payments"
                                                  r"\.percent_can_retry"):
        Registry.from_file(file, redis=fakeredis.FakeRedis(), environ={})


def test_syntax_errors_and_unknown_formats(tmp_path: Path) -> None:
    with pytest.raises(RegistryConfigError, match="not valid YAML"):
        Registry.from_file(_write(tmp_path, "bad.yaml", "breakers: [\n"), environ={})
    with pytest.raises(RegistryConfigError, match="not valid TOML"):
        Registry.from_file(_write(tmp_path, "bad.toml", "breakers = \n"), environ={})
    with pytest.raises(RegistryConfigError, match="unknown file type"):
        Registry.from_file(_write(tmp_path, "r.ini", "[x]\n"), environ={})
    with pytest.raises(RegistryConfigError, match="cannot read the file"):
        Registry.from_file(tmp_path / "missing.yaml", environ={})
    with pytest.raises(RegistryConfigError, match="redis: must be a URL string"):
        Registry.from_dict({"redis": {"host": "x"}}, environ={})


def test_a_dict_may_hold_python_objects() -> None:
    registry = _registry({"breakers": {"instances": {"a": {
        "ignore_exceptions": (KeyError,), "wait_duration_in_open_state": 5}}},
        "policies": {"instances": {"a": {"fallback": lambda error: "cached"}}}})
    assert registry.breaker("a").config.ignore_exceptions == (KeyError,)
    assert registry.policy("a").fallback(ValueError()) == "cached"


def test_components_are_built_through_public_constructors() -> None:
    registry = _registry({"budgets": {"instances": {"b": {"slices": 5}}}})
    budget = registry.budget("b")
    assert isinstance(budget, RetryBudget)
    assert budget.config.slices == 5
    assert registry.declared("budget") == ["b"]


ADAPTIVE_YAML = """\
breakers:
  instances:
    llm: {ramp_duration: 45s, ramp_start: 0.25}
    quick: {ramp_duration: 500ms}
bulkheads:
  configs:
    default: {critical_reserve: 0.2, sheddable_share: 0.5}
  instances:
    llm:
      max_concurrent_calls: 8
      adaptive: {min_limit: 2, max_limit: "${LLM_MAX:-40}", initial_limit: 4,
                 backoff_ratio: 0.75, tolerance: 2, smoothing: "0.1"}
    defaults: {adaptive: true}
    fixed: {adaptive: null, critical_reserve: 0.0}
"""


def test_yaml_adaptive_bulkhead_priorities_and_slow_start(tmp_path: Path) -> None:
    from distbreaker.bulkhead.adaptive import AdaptiveLimit

    registry = Registry.from_file(_write(tmp_path, "r.yaml", ADAPTIVE_YAML),
                                  redis=fakeredis.FakeRedis(), environ={"LLM_MAX": "30"})
    llm = registry.bulkhead("llm").config
    assert llm.adaptive == AdaptiveLimit(min_limit=2, max_limit=30, initial_limit=4,
                                         backoff_ratio=0.75, tolerance=2.0, smoothing=0.1)
    assert llm.adaptive.wire() == "2,30,4,750000,2000000,100000,0,10000,200"
    assert (llm.max_concurrent_calls, llm.critical_reserve, llm.sheddable_share) == (8, 0.2, 0.5)
    assert registry.bulkhead("defaults").config.adaptive == AdaptiveLimit()
    fixed = registry.bulkhead("fixed").config
    assert fixed.adaptive is None and fixed.critical_reserve == 0.0
    assert fixed.sheddable_share == 0.5  # from the default config
    breaker = registry.breaker("llm").config
    assert (breaker.ramp_duration, breaker.ramp_start) == (45.0, 0.25)
    assert breaker.to_wire() == BreakerConfig(ramp_duration=45, ramp_start=0.25).to_wire()
    assert registry.breaker("quick").config.ramp_duration == 0.5
    assert registry.breaker("quick").config.ramp_start == 0.1  # the default


def test_adaptive_from_the_environment_is_json() -> None:
    registry = _registry({}, {"DISTBREAKER_BULKHEAD_LLM_ADAPTIVE": '{"max_limit": 12}',
                              "DISTBREAKER_BULKHEAD_LLM_SHEDDABLE_SHARE": "0.6",
                              "DISTBREAKER_BREAKER_LLM_RAMP_DURATION": "2m"})
    config = registry.bulkhead("llm").config
    assert config.adaptive is not None and config.adaptive.max_limit == 12
    assert config.sheddable_share == 0.6
    assert registry.breaker("llm").config.ramp_duration == 120


@pytest.mark.parametrize(("settings", "field", "problem"), [
    ("{adaptive: {min_limit: 0}}", "adaptive", "min_limit must be in"),
    ("{adaptive: {min_limit: 5, max_limit: 2}}", "adaptive", "max_limit must be in"),
    ("{adaptive: {limit: 5}}", "adaptive", "unknown setting 'limit'"),
    ("{adaptive: {backoff_ratio: lots}}", "adaptive", "backoff_ratio must be a number"),
    ("{adaptive: [1, 2]}", "adaptive", "must be a mapping"),
    ("{critical_reserve: 1.5}", "critical_reserve", "must be a number in [0, 1)"),
    ("{sheddable_share: -0.1}", "sheddable_share", "must be a number in [0, 1)"),
])
def test_bad_adaptive_settings_name_the_field(tmp_path: Path, settings: str, field: str,
                                              problem: str) -> None:
    file = _write(tmp_path, "r.yaml", f"bulkheads: {{instances: {{llm: {settings}}}}}\n")
    with pytest.raises(RegistryConfigError) as caught:
        Registry.from_file(file, redis=fakeredis.FakeRedis(), environ={})
    assert (caught.value.path, caught.value.field) == ("bulkheads.instances.llm", field)
    assert problem in str(caught.value)


@pytest.mark.parametrize(("settings", "field", "problem"), [
    ("{ramp_duration: soon}", "ramp_duration", "must be a duration"),
    ("{ramp_start: 0}", "ramp_start", "must be a number in (0, 1]"),
])
def test_bad_ramp_settings_name_the_field(tmp_path: Path, settings: str, field: str,
                                          problem: str) -> None:
    file = _write(tmp_path, "r.yaml", f"breakers: {{instances: {{llm: {settings}}}}}\n")
    with pytest.raises(RegistryConfigError) as caught:
        Registry.from_file(file, redis=fakeredis.FakeRedis(), environ={})
    assert (caught.value.path, caught.value.field) == ("breakers.instances.llm", field)
    assert problem in str(caught.value)

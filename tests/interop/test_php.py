"""Cross-language interop: PHP workers (clients/php) and Python workers share one breaker.

Every PHP step runs in a real `php` process (clients/php/tests/worker.php, one
JSON job in, one JSON result out), against the same real redis-server as the
Python side. php-cli and php-redis are required: scripts/test installs them,
so a missing PHP fails these tests instead of skipping them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis

from distbreaker import CircuitBreaker, Registry
from distbreaker import readside as view
from distbreaker._runtime.keys import DEFAULT_PREFIX, BreakerKeys, BulkheadKeys, events_channel
from distbreaker._runtime.scripts import load_script, lua_dir, run_script
from distbreaker._runtime.state_record import decode_record, encode_fields
from distbreaker.breaker.config import BreakerConfig
from distbreaker.breaker.core import config_fingerprint
from distbreaker.breaker.state import State
from distbreaker.demo.embedded import RedisServer
from distbreaker.errors import CallNotPermitted, SchemaError
from distbreaker.readside import decode_event_message, read_history
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "clients" / "php" / "tests" / "worker.php"

SMALL = {"sliding_window_type": "COUNT_BASED", "sliding_window_size": 10,
         "minimum_number_of_calls": 5, "failure_rate_threshold": 50,
         "wait_duration_in_open_state": 30.0, "permitted_calls_in_half_open": 2}


class Php:
    """Runs worker.php jobs against the test's redis-server."""

    def __init__(self, binary: str, server: RedisServer) -> None:
        self.binary = binary
        self.port = server.port

    def _argv(self, job: dict[str, Any]) -> list[str]:
        return [self.binary, str(WORKER), json.dumps({"port": self.port, **job})]

    def run(self, **job: Any) -> Any:
        done = subprocess.run(self._argv(job), capture_output=True, text=True, timeout=20)
        assert done.returncode == 0, f"php failed ({done.returncode}): {done.stderr}{done.stdout}"
        return json.loads(done.stdout)

    def start(self, **job: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(self._argv(job), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)


@pytest.fixture
def php_worker(php: str, redis_server: RedisServer, redis_url: str) -> Php:
    return Php(php, redis_server)


def finish(proc: subprocess.Popen[str]) -> Any:
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, f"worker failed ({proc.returncode}): {err}{out}"
    return json.loads(out)


def python_breaker(name: str, redis_url: str, **overrides: Any) -> CircuitBreaker:
    return CircuitBreaker(name, redis=redis_url, **{**SMALL, **overrides})


def failing(client: redis.Redis, counter: str) -> Any:
    def dependency() -> None:
        client.incr(counter)
        raise ConnectionError("dependency down")
    return dependency


# -- config: no drift between languages ---------------------------------------------

WIRE_CASES: list[dict[str, Any]] = [
    {},
    SMALL,
    {"failure_rate_threshold": 33.5, "slow_call_rate_threshold": 12.345678901234567,
     "slow_call_duration": 1.2345, "wait_duration_in_open_state": 0.0025},
    {"sliding_window_type": "time", "sliding_window_size": 60, "minimum_number_of_calls": 500,
     "key_ttl": 7200, "max_wait_in_half_open": 12.5, "half_open_lease": 0.0015},
    {"sliding_window_type": "count", "sliding_window_size": 20, "minimum_number_of_calls": 50,
     "failure_rate_threshold": 1e-05, "slow_call_rate_threshold": 99.99999999999999,
     "slow_call_duration": 0.0005, "permitted_calls_in_half_open": 3},
    {"failure_rate_threshold": 100, "slow_call_rate_threshold": 0.1,
     "wait_duration_in_open_state": 0.001, "key_ttl": 60.0},
    {"initial_state": "FORCED_OPEN"},
    {"transition_after_max_wait_in_half_open": "CLOSED"},
    {"initial_state": "METRICS_ONLY", "transition_after_max_wait_in_half_open": "CLOSED"},
    {"wait_interval_multiplier": 2},
    {"wait_interval_multiplier": 1.5, "max_wait_duration_in_open_state": 600.0005,
     "wait_randomization_factor": 0.125},
    {"wait_randomization_factor": 1e-05},
    {"config_version": 3},
    {"config_version": 1, "ramp_start": 0.5, "failure_rate_threshold": 30},
]


def test_php_computes_the_same_config_wire_string_as_python(php_worker: Php) -> None:
    php_wires = php_worker.run(action="wire", configs=WIRE_CASES)
    python_wires = [BreakerConfig(**case).to_wire() for case in WIRE_CASES]
    assert php_wires == python_wires
    assert python_wires[0] == "1;C;100;100;50;100;60000;10;0;60000;3600000;60000"


def test_php_sends_the_same_config_fingerprint_as_python(php_worker: Php) -> None:
    fingerprints = php_worker.run(action="fingerprint", configs=WIRE_CASES)
    assert fingerprints == [config_fingerprint(BreakerConfig(**case).to_wire())
                            for case in WIRE_CASES]


def test_php_and_python_agree_on_the_stored_config(php_worker: Php, redis_client: redis.Redis,
                                                  name: str, redis_url: str) -> None:
    php_worker.run(action="calls", name=name, config=SMALL, counter="dep", n=1, fail=False)
    keys = BreakerKeys.build(name)
    stored = redis_client.hget(keys.meta, "cfg")
    wire = BreakerConfig(**SMALL).to_wire()
    assert stored is not None and stored.decode() == wire
    record = decode_record(redis_client.get(keys.state))
    assert (record["fp"], record["calls"], record["failures"]) == (config_fingerprint(wire), 1, 0)
    breaker = python_breaker(name, redis_url)
    breaker.call(lambda: "ok")
    assert breaker.config_drift is None


def test_a_php_worker_with_a_newer_config_puts_it_in_force_keeping_the_window(
        php_worker: Php, name: str, redis_url: str) -> None:
    """The rollout rule holds for PHP (docs/OPERATIONS.md, "Changing a breaker's config"):
    PHP says hello after its first drifting reply, so its newer config is in force from
    its second call; the window is kept; the Python worker then drifts."""
    python = CircuitBreaker(name, redis=redis_url, **SMALL)
    python.call(lambda: "ok")
    python.call(lambda: "ok")
    newer = {**SMALL, "failure_rate_threshold": 30, "hello_rate": 0}
    result = php_worker.run(action="calls", name=name, config=newer, counter="dep", n=3,
                            fail=False)
    assert [r["outcome"] for r in result] == ["ok"] * 3
    php_config = {k: v for k, v in newer.items() if k != "hello_rate"}
    php_fp = config_fingerprint(BreakerConfig(**php_config).to_wire())
    shown = view.read_detail(redis.Redis.from_url(redis_url), DEFAULT_PREFIX, name)["breaker"]
    assert shown["config_in_force"]["fingerprint"] == str(php_fp)
    assert shown["config_in_force"]["why"] == "newest deployment"
    assert shown["window"]["calls"] == 5
    with pytest.warns(Warning):
        python.call(lambda: "ok")
    assert python.config_drift == BreakerConfig(**php_config).to_wire()


def test_php_decodes_the_short_reply_of_a_record_that_changed_nothing(
        php_worker: Php, redis_client: redis.Redis, name: str) -> None:
    keys = BreakerKeys.build(name)
    wire = BreakerConfig(**SMALL).to_wire()
    raw = run_script(redis_client, load_script("breaker"), keys.script_keys,
                     ["record", config_fingerprint(wire), wire, name, keys.channel, "", 1, 0, 0, 5])
    assert len(raw) == 3, "a CLOSED success answers the short reply {state, now_ms, since_ms}"
    result = php_worker.run(action="records", name=name, config=SMALL, n=2)
    replies = result["replies"]
    assert [(r["state"], r["permitted"], r["transitions"], r["drift"]) for r in replies] == \
        [("CLOSED", True, [], False)] * 2
    assert all(r["since_ms"] == int(raw[2]) and r["now_ms"] >= int(raw[1]) for r in replies)
    assert (result["metrics"]["state"], result["metrics"]["calls"]) == ("CLOSED", 3)
    assert decode_record(redis_client.get(keys.state))["calls"] == 3


def test_php_refuses_a_lua_dir_holding_module_sources(php_worker: Php, name: str) -> None:
    assert (lua_dir() / "breaker.lua").read_text().startswith("--!module")
    result = php_worker.run(action="load_error", name=name, lua_dir=str(lua_dir()))
    assert result["outcome"] == "refused"
    assert "is a module source, not its EVAL form" in result["message"]


# -- a breaker tripped by one language rejects the other ---------------------------

def test_failures_recorded_by_php_open_the_breaker_for_python(
        php_worker: Php, redis_client: redis.Redis, name: str, redis_url: str) -> None:
    pubsub = redis_client.pubsub()
    pubsub.subscribe(events_channel())
    pubsub.get_message(timeout=1.0)  # subscribe confirmation

    outcomes = php_worker.run(action="calls", name=name, config=SMALL, counter="dep", n=7,
                              fail=True)
    assert [o["outcome"] for o in outcomes] == ["failed"] * 5 + ["rejected"] * 2
    assert outcomes[5]["class"] == "Distbreaker\\CallNotPermitted"
    assert int(redis_client.get("dep") or 0) == 5

    breaker = python_breaker(name, redis_url)
    assert breaker.state is State.OPEN
    with pytest.raises(CallNotPermitted) as info:
        breaker.call(failing(redis_client, "dep"))
    assert info.value.state is State.OPEN and 15 < info.value.retry_after <= 30  # (of 30 s)
    assert int(redis_client.get("dep") or 0) == 5
    metrics = breaker.metrics()
    assert (metrics.calls, metrics.failed, metrics.failure_rate) == (5, 5, 100.0)

    # the transition PHP made is in the history Python reads, and on pub/sub, once
    history = read_history(redis_client, "distbreaker", name, 10)
    assert [(e["from"], e["to"]) for e in history] == [("CLOSED", "OPEN")]
    assert history[0]["reason"] == "failure rate 100% >= 50%"
    assert history[0]["failure_rate"] == 100.0
    message = pubsub.get_message(timeout=2.0)
    assert message is not None and message["type"] == "message"
    event = decode_event_message(message["data"])
    assert event is not None
    assert (event["name"], event["from"], event["to"]) == (name, "CLOSED", "OPEN")
    assert event["at_ms"] == history[0]["at_ms"]
    assert pubsub.get_message(timeout=0.2) is None
    pubsub.close()


def test_failures_recorded_by_python_reject_php(
        php_worker: Php, redis_client: redis.Redis, name: str, redis_url: str) -> None:
    breaker = python_breaker(name, redis_url)
    for _ in range(5):
        with pytest.raises(ConnectionError):
            breaker.call(failing(redis_client, "dep"))
    assert breaker.state is State.OPEN

    outcomes = php_worker.run(action="calls", name=name, config=SMALL, counter="dep", n=3,
                              fail=True)
    assert [o["outcome"] for o in outcomes] == ["rejected"] * 3
    assert {o["state"] for o in outcomes} == {"OPEN"}
    assert all(25 < o["retry_after"] <= 30 for o in outcomes)
    assert int(redis_client.get("dep") or 0) == 5
    # only the first PHP call asked Redis; the others were rejected from the local view
    assert breaker.metrics().rejected_fleet_wide == 1
    # each PHP rejection says why, as Python's does (the reply's reason, then the view's)
    with pytest.raises(CallNotPermitted) as python_rejection:
        breaker.call(lambda: "never")
    assert python_rejection.value.reason == "failure rate 100% >= 50%"
    assert [(o["reason"], o["actor"]) for o in outcomes] == [
        (python_rejection.value.reason, python_rejection.value.actor)] * 3
    assert all("(failure rate 100% >= 50%)" in o["message"] for o in outcomes)

    fallback = php_worker.run(action="fallback", name=name, config=SMALL)
    assert fallback == {"status": "queued", "because": "Distbreaker\\CallNotPermitted"}


def test_php_operator_trip_reaches_python_history_pubsub_and_php_listener(
        php_worker: Php, redis_client: redis.Redis, name: str, redis_url: str) -> None:
    pubsub = redis_client.pubsub()
    pubsub.subscribe(events_channel())
    pubsub.get_message(timeout=1.0)
    result = php_worker.run(action="trip", name=name, config=SMALL, reason="deploy \"x\"\n")
    assert result["state"] == "OPEN"
    assert [(e["from"], e["to"], e["reason"]) for e in result["seen"]] == [
        ("CLOSED", "OPEN", "deploy \"x\"\n")]

    history = read_history(redis_client, "distbreaker", name, 10)
    assert [(e["to"], e["reason"], e["actor"]) for e in history] == [
        ("OPEN", "deploy \"x\"\n", "php")]
    message = pubsub.get_message(timeout=2.0)
    assert message is not None
    event = decode_event_message(message["data"])
    assert event is not None and (event["to"], event["reason"], event["actor"]) == (
        "OPEN", "deploy \"x\"\n", "php")
    pubsub.close()
    with pytest.raises(CallNotPermitted):
        python_breaker(name, redis_url).call(lambda: "never")


def test_php_override_that_ends_rejects_python_with_the_remaining_time(
        php_worker: Php, redis_client: redis.Redis, name: str, redis_url: str) -> None:
    # set on a name without keys: the config stays 'unset'; PHP's call then stores its own
    # (5 s: long enough that a loaded machine still calls from Python before it ends)
    result = php_worker.run(action="hold", name=name, config=SMALL, state="FORCED_OPEN",
                            reason="maintenance", **{"for": 5})
    assert result["state"] == "FORCED_OPEN"
    assert result["call"]["outcome"] == "rejected"
    assert 0 < result["call"]["retry_after"] <= 5
    assert (result["call"]["reason"], result["call"]["actor"]) == ("maintenance", "php")
    assert "(maintenance, by php)" in result["call"]["message"]
    breaker = python_breaker(name, redis_url)
    assert redis_client.hget(breaker.keys.meta, "cfg").decode() == breaker.config.to_wire()
    with pytest.raises(CallNotPermitted) as rejected:
        breaker.call(lambda: "never")
    assert 0 < rejected.value.retry_after <= 5 and breaker.config_drift is None
    wait_until(lambda: breaker.state is State.HALF_OPEN, interval=0.1,
               what="the override ends in HALF_OPEN")
    history = read_history(redis_client, "distbreaker", name, 10)
    assert [(e["to"], e["actor"]) for e in history] == [("FORCED_OPEN", "php"),
                                                         ("HALF_OPEN", "")]
    assert history[0]["until_ms"] == history[1]["until_ms"]


# -- half-open probes are limited fleet-wide, across both languages --------------

PY_PROBE = textwrap.dedent("""
    import json, sys, time
    import redis
    from distbreaker import CallNotPermitted, CircuitBreaker
    job = json.loads(sys.argv[1])
    client = redis.Redis(port=job["port"])
    breaker = CircuitBreaker(job["name"], redis=client, **job["config"])
    client.blpop([job["gate"]], 50)
    def dependency():
        client.incr(job["counter"])
        time.sleep(job["hold"])
        return "ok"
    try:
        out = {"outcome": breaker.call(dependency)}
    except CallNotPermitted as e:
        out = {"outcome": "rejected", "state": str(e.state)}
    print(json.dumps(out))
""")


def test_half_open_probes_are_limited_fleet_wide_across_php_and_python(
        php_worker: Php, redis_server: RedisServer, redis_client: redis.Redis, name: str,
        redis_url: str) -> None:
    config = {**SMALL, "wait_duration_in_open_state": 0.3}
    breaker = python_breaker(name, redis_url, **config)
    assert breaker.trip("test") is State.OPEN
    tripped = time.monotonic()

    job = {"name": name, "config": config, "counter": "probes", "gate": "gate",
           "hold": 5.0}  # long enough that every worker asks before a probe reports
    procs = [php_worker.start(action="probe", **job) for _ in range(3)]
    procs += [subprocess.Popen([sys.executable, "-c", PY_PROBE,
                                json.dumps({"port": redis_server.port, **job})],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(3)]
    # PHP workers count themselves ready by waiting at the gate: poll the gate's clients
    wait_until(lambda: int(redis_client.info("clients")["blocked_clients"]) >= 6,
               timeout=40, interval=0.02, what="all 6 workers wait at the gate")
    assert int(redis_client.info("clients")["blocked_clients"]) == 6
    time.sleep(max(0.0, 0.35 - (time.monotonic() - tripped)))
    redis_client.rpush("gate", *["go"] * 6)

    results = [finish(p) for p in procs]
    outcomes = sorted(r["outcome"] for r in results)
    assert int(redis_client.get("probes") or 0) == 2
    assert outcomes == ["ok", "ok"] + ["rejected"] * 4
    assert {r["state"] for r in results if r["outcome"] == "rejected"} == {"HALF_OPEN"}
    assert breaker.state is State.CLOSED
    history = read_history(redis_client, "distbreaker", name, 10)
    assert [e["to"] for e in history] == ["OPEN", "HALF_OPEN", "CLOSED"]


# -- the schema-version guard, in both languages --------------------------------------

def test_a_different_schema_version_raises_schema_error_in_python_and_php(
        php_worker: Php, redis_client: redis.Redis, name: str, redis_url: str) -> None:
    python_breaker(name, redis_url).call(lambda: "ok")
    key = BreakerKeys.build(name).state
    assert php_worker.run(action="schema", name=name, config=SMALL) == {"outcome": "permitted"}
    # a record of another layout (another magic number, e.g. a later schema's)
    foreign = encode_fields(redis_client.get(key), magic=1684174387)
    redis_client.set(key, foreign)

    with pytest.raises(SchemaError, match="is not a distbreaker v2 state record") as info:
        python_breaker(name, redis_url).call(lambda: "never")
    assert info.value.key == key
    result = php_worker.run(action="schema", name=name, config=SMALL)
    assert result["outcome"] == "schema_error"
    assert result["class"] == "Distbreaker\\SchemaError"
    assert result["key"] == key
    assert "is not a distbreaker v2 state record" in result["message"]
    assert redis_client.get(key) == foreign  # nothing was rewritten


def test_php_reloads_the_shared_script_after_noscript(
        php_worker: Php, redis_client: redis.Redis, name: str) -> None:
    sha = load_script("breaker").sha  # PHP hashes the same file: same EVALSHA handle
    redis_client.script_flush()
    assert redis_client.script_exists(sha) == [False]
    php_worker.run(action="calls", name=name, config=SMALL, counter="dep", n=1, fail=False)
    assert redis_client.script_exists(sha) == [True]


# -- retry budget shared by both languages -----------------------------------------

def test_retry_budget_deposits_from_php_fund_python_retries(
        php_worker: Php, redis_client: redis.Redis, name: str, redis_url: str) -> None:
    from distbreaker.budget.sync import RetryBudget

    options = {"percent_can_retry": 0.2, "min_retries_per_sec": 0.1, "ttl": 10.0, "slices": 10}
    # floor(0.1 * 10 + 0.2 * 10 deposits) = 3 retries for the whole fleet
    assert php_worker.run(action="budget", name=name, config=options, deposits=10) == {
        "taken": 0, "balance": 3}
    budget = RetryBudget(name, redis=redis_url, **options)
    assert [budget.try_withdraw() for _ in range(2)] == [True, True]
    assert php_worker.run(action="budget", name=name, config=options, withdrawals=2) == {
        "taken": 1, "balance": 0}
    assert budget.try_withdraw() is False


# -- one bulkhead limit across both languages -------------------------------------

PY_BULKHEAD = textwrap.dedent("""
    import json, sys, time
    import redis
    from distbreaker.bulkhead import Bulkhead
    from distbreaker.errors import BulkheadFull
    job = json.loads(sys.argv[1])
    client = redis.Redis(port=job["port"])
    bulkhead = Bulkhead(job["name"], redis=client, **job["config"])
    peak = client.register_script(
        "local m = tonumber(redis.call('GET', KEYS[2]) or '0') "
        "if ARGV[1] + 0 > m then redis.call('SET', KEYS[2], ARGV[1]) end return 1")
    client.blpop([job["gate"]], 50)
    def dependency():
        now = client.incr(job["counter"])
        peak(keys=[job["counter"], job["peak"]], args=[now])
        time.sleep(job["hold"])
        client.decr(job["counter"])
        return "ok"
    try:
        out = {"outcome": bulkhead.call(dependency)}
    except BulkheadFull as e:
        out = {"outcome": "full", "in_use": e.in_use, "limit": e.limit}
    print(json.dumps(out))
""")


def run_bulkhead_fleet(php_worker: Php, redis_server: RedisServer, redis_client: redis.Redis,
                       name: str, config: dict[str, Any],
                       hold: float = 0.3) -> tuple[list[Any], float]:
    """Three PHP and three Python processes each make one bulkhead call at the same moment."""
    job = {"name": name, "config": config, "counter": "inside", "peak": "peak",
           "gate": "gate", "hold": hold}
    procs = [php_worker.start(action="bulkhead", **job) for _ in range(3)]
    procs += [subprocess.Popen([sys.executable, "-c", PY_BULKHEAD,
                                json.dumps({"port": redis_server.port, **job})],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(3)]
    wait_until(lambda: int(redis_client.info("clients")["blocked_clients"]) >= 6,
               timeout=40, interval=0.02, what="all 6 workers wait at the gate")
    assert int(redis_client.info("clients")["blocked_clients"]) == 6
    released = time.monotonic()
    redis_client.rpush("gate", *["go"] * 6)
    results = [finish(p) for p in procs]
    return results, time.monotonic() - released


def test_bulkhead_fail_fast_limit_holds_across_php_and_python(
        php_worker: Php, redis_server: RedisServer, redis_client: redis.Redis,
        name: str) -> None:
    config = {"max_concurrent_calls": 2, "max_wait_duration": 0, "lease": 10.0}
    results, _ = run_bulkhead_fleet(php_worker, redis_server, redis_client, name, config, 1.0)
    assert sorted(r["outcome"] for r in results) == ["full"] * 4 + ["ok"] * 2
    assert {(r["in_use"], r["limit"]) for r in results if r["outcome"] == "full"} == {(2, 2)}
    assert int(redis_client.get("peak") or 0) == 2


def test_bulkhead_waiters_of_both_languages_are_woken_by_either(
        php_worker: Php, redis_server: RedisServer, redis_client: redis.Redis,
        name: str) -> None:
    config = {"max_concurrent_calls": 2, "max_wait_duration": 60.0, "lease": 60.0}
    results, elapsed = run_bulkhead_fleet(php_worker, redis_server, redis_client, name, config)
    # three rounds of 0.3 s, every waiter let in: woken by the releases of either
    # language (a waiter whose 60 s ran out would be refused, "full")
    assert [r["outcome"] for r in results] == ["ok"] * 6
    assert int(redis_client.get("peak") or 0) == 2
    assert elapsed < 60.0
    assert redis_client.zcount(BulkheadKeys.build(name).leases, 1, "+inf") == 0


def test_php_applies_the_redis_outage_policy(php_worker: Php, name: str) -> None:
    from distbreaker.demo.embedded import free_port

    result = php_worker.run(action="outage", name=name, dead_port=free_port())
    assert result["fail_open"] == "ran"
    assert result["fail_closed"]["outcome"] == "rejected"
    assert result["fail_closed"]["state"] == "UNKNOWN"


# -- a Connection that cannot connect: fail_open applies, Redis is not hammered ----------

def test_a_failed_connect_is_a_redis_outage_for_every_component(php_worker: Php,
                                                                 name: str) -> None:
    from distbreaker.demo.embedded import free_port

    dead = {"port": free_port(), "timeout": 0.2, "retry_interval": 60}
    result = php_worker.run(action="lazy", name=name, connection=dead, n=5, config=SMALL)
    assert result["attempts_after_construct"] == 0, "building components must not connect"
    assert result["calls"] == ["ran"] * 5          # fail_open: the call runs, unrecorded
    assert result["bulkhead"] == "ran"             # the per-process fallback limit
    assert (result["deposit"], result["withdraw"]) == (0, False)  # no retries while down
    assert result["attempts"] == 1, "one connect attempt per retry_interval, not one per call"
    assert result["connected"] is False

    closed = php_worker.run(action="lazy", name=name, connection=dead, n=1,
                            config={**SMALL, "on_redis_error": "fail_closed"})
    (rejection,) = closed["calls"]
    assert rejection["outcome"] == "rejected" and rejection["state"] == "UNKNOWN"


def test_a_connection_reconnects_once_redis_is_up(php_worker: Php, redis_client: redis.Redis,
                                                   name: str) -> None:
    from distbreaker.demo.embedded import free_port

    port = free_port()
    late = RedisServer(port=port)
    worker = php_worker.start(action="lazy", name=name, n=2, ready="ready", gate="go",
                              pause=0.3, config=SMALL,
                              connection={"url": f"redis://127.0.0.1:{port}/2",
                                          "retry_interval": 0.2})
    try:
        first = redis_client.blpop(["ready"], timeout=20)   # the first call failed open
        assert first is not None and first[1] == b"1"
        late.start()
        redis_client.rpush("go", "1")
        result = finish(worker)
        assert result["calls"] == ["ran", "ran"]
        assert result["attempts"] == 2 and result["connected"] is True
        # the second call was recorded on the server that came up, in the URL's database 2
        late_client = redis.Redis(port=port, db=2)
        record = late_client.get(BreakerKeys.build(name).state)
        assert record is not None and decode_record(record)["calls"] == 1, \
            "the call made after Redis came up was not recorded"
        assert late_client.exists(BulkheadKeys.build(name).meta) == 1
        assert int(redis.Redis(port=port, db=0).dbsize()) == 0
    finally:
        late.stop()


# -- the Registry: named components from one config --------------------------------

REGISTRY = {
    "prefix": "distbreaker",
    "breakers": {
        "configs": {"default": {"failure_rate_threshold": 50, "wait_duration_in_open_state": "30s"},
                    "fast": {"sliding_window_size": 10, "minimum_number_of_calls": "5",
                             "slow_call_duration": "500ms"}},
        "instances": {"payments": {"base_config": "fast", "permitted_calls_in_half_open": 2}},
    },
    "bulkheads": {"instances": {"payments": {"max_concurrent_calls": 3}}},
}


def test_registry_builds_one_instance_per_name_from_its_config(php_worker: Php,
                                                              redis_server: RedisServer) -> None:
    port = redis_server.port
    payments = php_worker.run(action="registry", port=port, registry=REGISTRY, kind="breaker",
                              name="payments")
    assert payments["same"] is True and payments["class"] == "Distbreaker\\CircuitBreaker"
    assert payments["wire"] == BreakerConfig(sliding_window_size=10, minimum_number_of_calls=5,
                                             slow_call_duration=0.5,
                                             permitted_calls_in_half_open=2).to_wire()
    # a name the config does not list gets configs.default
    other = php_worker.run(action="registry", port=port, registry=REGISTRY, kind="breaker",
                           name="search")
    assert other["wire"] == BreakerConfig(wait_duration_in_open_state=30).to_wire()
    bulkhead = php_worker.run(action="registry", port=port, registry=REGISTRY, kind="bulkhead",
                              name="payments")
    assert bulkhead["options"]["max_concurrent_calls"] == 3


def test_registry_durations_read_as_in_python(php_worker: Php,
                                              redis_server: RedisServer) -> None:
    """One duration grammar in both languages: a shared file means the same config."""
    settings = {"wait_duration_in_open_state": "1m30s", "slow_call_duration": "PT2.5S",
                "half_open_lease": "250ms", "key_ttl": "2d"}
    config = {"breakers": {"instances": {"payments": settings}}}
    php = php_worker.run(action="registry", port=redis_server.port, registry=config,
                         kind="breaker", name="payments")
    python = Registry.from_dict(config, redis=fakeredis.FakeRedis(), environ={})
    assert php["wire"] == python.breaker("payments").config.to_wire() == BreakerConfig(
        wait_duration_in_open_state=90, slow_call_duration=2.5, half_open_lease=0.25,
        key_ttl=172800).to_wire()


@pytest.mark.parametrize(("change", "expected"), [
    ({"breakers": {"instances": {"payments": {"base_config": "nope"}}}},
     "breakers.instances.payments.base_config: no config named 'nope'"),
    ({"breakers": {"instances": {"payments": {"wait_duration_in_open_state": "30x"}}}},
     "breakers.instances.payments.wait_duration_in_open_state: '30x' is not a duration"),
    ({"breakers": {"instances": {"payments": {"failure_rate_threshold": 150}}}},
     "breakers.instances.payments: failure_rate_threshold"),
    ({"bulkheads": {"instances": {"payments": {"max_concurent_calls": 3}}}},
     "bulkheads.instances.payments: unknown bulkhead option(s): max_concurent_calls"),
])
def test_registry_errors_name_the_instance_and_the_option(
        php_worker: Php, redis_server: RedisServer, change: dict[str, Any], expected: str) -> None:
    kind = "bulkhead" if "bulkheads" in change else "breaker"
    result = php_worker.run(action="registry", port=redis_server.port, registry=change,
                            kind=kind, name="payments")
    assert expected in result["error"]


def test_php_records_feed_a_shadow_config(php_worker: Php, redis_client: redis.Redis,
                                          name: str, redis_url: str) -> None:
    """Shadow configs (docs/guides/shadow.md): PHP sets none, but its records go through
    the same script, so they feed the shadows Python (or an operator) set."""
    from distbreaker import operate
    from distbreaker.readside import read_shadows

    python_breaker(name, redis_url).call(lambda: None)
    operate.set_shadow(redis_client, "distbreaker", name, "strict",
                       {"failure_rate_threshold": 10, "minimum_number_of_calls": 2}, "r", "a")
    outcomes = php_worker.run(action="calls", name=name, config=SMALL, counter="dep", n=3,
                              fail=True)
    assert [o["outcome"] for o in outcomes] == ["failed"] * 3
    (shadow,) = read_shadows(redis_client, "distbreaker", name)
    assert (shadow["seen"], shadow["seen_failures"], shadow["trips"]) == (3, 3, 1)
    assert (shadow["rejected"], shadow["avoided"]) == (1, 1)


def test_php_sends_the_compact_record_and_python_reads_the_same_window(
        php_worker: Php, redis_url: str, name: str) -> None:
    """PHP follows the compact record (docs/KEY_SCHEMA.md, "The compact record"): once its
    view is CLOSED a success sends ARGV {fingerprint, ms} only; the window is shared."""
    seen: list[str] = []
    done = f"compact-done-{name}"
    monitor_client = redis.Redis.from_url(redis_url, decode_responses=True)

    def watch() -> None:
        with monitor_client.monitor() as m:
            for command in m.listen():
                seen.append(command["command"])
                if done in command["command"]:
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    wait_until(lambda: redis.Redis.from_url(redis_url).ping() and _monitoring(redis_url),
               timeout=10)
    result = php_worker.run(action="calls", name=name, config={**SMALL, "hello_rate": 0},
                            counter=f"{name}:dep", n=4, fail=False)
    assert [r["outcome"] for r in result] == ["ok"] * 4
    redis.Redis.from_url(redis_url).echo(done)
    watcher.join(timeout=10)
    state_key = BreakerKeys.build(name).state
    scripts = [c.split() for c in seen if c.upper().startswith("EVALSHA")]
    argvs = [c[3 + int(c[2]):] for c in scripts if c[3] == state_key]
    assert argvs[0][0] == "acquire" and len(argvs) == 5
    fp = config_fingerprint(BreakerConfig(**SMALL).to_wire())
    assert all(len(a) == 2 and a[0] == str(fp) for a in argvs[1:])
    python = python_breaker(name, redis_url)
    assert python.metrics().calls == 4
    monitor_client.close()


def _monitoring(redis_url: str) -> bool:
    """A MONITOR client is connected (CLIENT LIST shows its flag)."""
    clients = redis.Redis.from_url(redis_url).client_list()
    return any("O" in c.get("flags", "") for c in clients)

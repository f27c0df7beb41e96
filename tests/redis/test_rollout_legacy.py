"""A mixed fleet during the deploy that moved the config rollout into the meta hash: while
an older worker keeps the legacy rollout hash (`<state key>:cfgs`) alive, a newer
worker's hello counts the older workers in it and writes its own entry there too (so
neither takes its config back from the other), never refreshes its TTL, and readers
merge both (docs/KEY_SCHEMA.md, "Config rollouts")."""

from __future__ import annotations

import time
import warnings

import redis

from distbreaker import CircuitBreaker, ConfigDriftWarning
from distbreaker import readside as view
from distbreaker._runtime.keys import DEFAULT_PREFIX


def keys(name: str) -> tuple[str, str]:
    base = f"{DEFAULT_PREFIX}:v2:{{{name}}}:cb"
    return base + ":meta", base + ":cfgs"


def test_a_newer_worker_counts_and_informs_the_older_ones(
        name: str, redis_url: str, redis_client: redis.Redis) -> None:
    meta, legacy = keys(name)
    first = CircuitBreaker(name, redis=redis_url, sliding_window_size=10,
                           failure_rate_threshold=30.0, redis_timeout=5.0)
    first.call(lambda: None)                      # config A in force
    fp_a = str(first._codec.fingerprint)
    first.close()                                 # its goodbye: no newer worker runs A
    assert redis_client.hget(meta, f"d:{fp_a}") is not None
    assert not redis_client.exists(legacy)        # a newer worker writes no legacy hash
    # an older worker runs A and keeps the legacy hash (as clients before the merge did)
    now = int(redis_client.time()[0]) * 1000
    redis_client.hset(legacy, mapping={"w:old-1": f"{fp_a}:{now}", f"d:{fp_a}": now - 1000})
    redis_client.pexpire(legacy, 60_000)

    newer = CircuitBreaker(name, redis=redis_url, sliding_window_size=10, redis_timeout=5.0)
    newer.call(lambda: None)                      # config B: the newest deployment
    fp_b, worker = str(newer._codec.fingerprint), newer._codec.worker
    shown = view.read_detail(redis_client, DEFAULT_PREFIX, name)["breaker"]
    # the older worker runs A: B wins by its deploy time, not because A had no worker
    assert shown["config_in_force"]["fingerprint"] == fp_b
    assert shown["config_in_force"]["why"] == "newest deployment"
    assert {c["fingerprint"]: c["workers"] for c in shown["configs"]} == {fp_a: 1, fp_b: 1}
    # the older workers see the newer one, its deployment and the adoption
    old = {k.decode(): v.decode() for k, v in redis_client.hgetall(legacy).items()}
    assert old[f"w:{worker}"].startswith(f"{fp_b}:") and f"d:{fp_b}" in old
    assert old["f:why"] == "newest deployment"
    assert 0 < redis_client.pttl(legacy) <= 60_000  # its TTL is the older workers' to keep
    # a repeated hello refreshes the newer worker's entry in both hashes
    seen = old[f"w:{worker}"]
    time.sleep(0.01)
    newer._codec._next_hello = 0.0
    newer.call(lambda: None)
    assert redis_client.hget(legacy, f"w:{worker}").decode() != seen
    assert redis_client.hget(legacy, f"w:{worker}") == redis_client.hget(meta, f"w:{worker}")
    newer.close()
    assert redis_client.hget(legacy, f"w:{worker}") is None  # its goodbye, in both
    assert redis_client.hget(meta, f"w:{worker}") is None


def test_without_a_legacy_hash_a_breaker_owns_two_keys(
        name: str, redis_url: str, redis_client: redis.Redis) -> None:
    """An idle breaker: its state record and its meta hash (the stored config and the
    rollout's fields; the first config stored writes no `f:` fields: `show` says so)."""
    breaker = CircuitBreaker(name, redis=redis_url, sliding_window_size=10,
                             redis_timeout=5.0)
    breaker.call(lambda: None)
    breaker.close()
    base = f"{DEFAULT_PREFIX}:v2:{{{name}}}"
    assert sorted(k.decode() for k in redis_client.keys(base + "*")) == [
        base + ":cb", base + ":cb:meta"]
    fp = str(breaker._codec.fingerprint)
    assert sorted(k.decode() for k in redis_client.hkeys(base + ":cb:meta")) == [
        "cfg", f"d:{fp}"]
    in_force = view.read_detail(redis_client, DEFAULT_PREFIX, name)["breaker"][
        "config_in_force"]
    deployed = int(redis_client.hget(base + ":cb:meta", f"d:{fp}"))
    assert in_force == {"fingerprint": fp, "since_ms": deployed, "why": "first config",
                        "actor": None}
    # a later adoption writes them
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigDriftWarning)
        CircuitBreaker(name, redis=redis_url, sliding_window_size=10,
                       failure_rate_threshold=30.0, redis_timeout=5.0).call(lambda: None)
    assert redis_client.hget(base + ":cb:meta", "f:why") == b"no worker runs the config in force"

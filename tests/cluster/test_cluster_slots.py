"""One hash slot per protected name: every key the schema builds, and every key every
script in lua/ is actually given, hashes to one Redis Cluster slot, for every name shape;
and every script runs unchanged on a real 3-primary cluster."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import pytest
from redis.cluster import RedisCluster, key_slot

from distbreaker import Bulkhead, CircuitBreaker, Pool, RateLimiter, RetryBudget
from distbreaker import inject as faults
from distbreaker._runtime.keys import (
    DEFAULT_PREFIX,
    MAX_NAME_LENGTH,
    BreakerKeys,
    BudgetKeys,
    BulkheadKeys,
    RateLimiterKeys,
)
from distbreaker._runtime.scripts import load_script, lua_dir
from distbreaker.ganesha.sync import GaneshaBreaker
from distbreaker.policy.sync import Policy

NAME_SHAPES = [
    "payments",
    "svc:payments:v2",          # colons, like the namespace's own separators
    "a{b}c",                    # a brace pair inside: Redis's tag is "a{b"
    "{tenant-7}",
    "a}b{c",
    "{",
    "x{}",
    "{{}}",
    "платёж-сервис",            # unicode: the slot is CRC16 of the UTF-8 bytes
    "支付/网关",
    "card-💳",
    "glob*?[chars]\\",
    "n" * MAX_NAME_LENGTH,
]


def slot(key: str) -> int:
    return int(key_slot(key.encode()))


def schema_keys(name: str) -> list[str]:
    """Every key distbreaker._runtime.keys builds for one name (breaker, bulkhead, budget)."""
    bulkhead = BulkheadKeys.build(name)
    breaker = BreakerKeys.build(name)
    return [breaker.state, breaker.meta, breaker.probes, breaker.history, bulkhead.leases,
            bulkhead.meta,
            bulkhead.notify, BudgetKeys.build(name).slices, RateLimiterKeys.build(name).bucket]


@pytest.mark.parametrize("name", NAME_SHAPES)
def test_all_keys_of_a_name_share_one_slot(name: str) -> None:
    keys = schema_keys(name)
    assert len(set(keys)) == 9
    assert {slot(k) for k in keys} == {slot(keys[0])}
    # ...and it is the slot of the name's own tag: the text up to the first "}".
    assert slot(keys[0]) == slot("{" + name + "}" + ":anything")


@pytest.mark.parametrize("name", ["}", "}x", "}{a}"])
def test_a_name_starting_with_a_closing_brace_is_rejected(name: str) -> None:
    """`{}...` is an empty tag: Redis would hash every key on its own (CROSSSLOT)."""
    for build in (BreakerKeys.build, BulkheadKeys.build, BudgetKeys.build,
                  RateLimiterKeys.build):
        with pytest.raises(ValueError, match="must not start with '}'"):
            build(name)
    with pytest.raises(ValueError, match="must not start with '}'"):
        CircuitBreaker(name, redis="redis://127.0.0.1:1/0")


class _RecordingPipeline:
    def __init__(self, pipe: Any, owner: Recorder) -> None:
        self._pipe, self._owner = pipe, owner

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self._owner.note(args)
        self._owner.pipelined += 1
        return self._pipe.execute_command(*args, **options)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._pipe, attr)


#: FCALL function name -> the sha of the same script's EVAL form.
_FUNCTION_SHAS = {script.function: script.sha for script in
                  (load_script(path.stem) for path in lua_dir().glob("*.lua")) if script.function}


class Recorder:
    """A RedisCluster client that remembers the script and KEYS of every script call."""

    def __init__(self, client: RedisCluster) -> None:
        self._client = client
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.pipelined = 0  # script calls sent in a (cluster) pipeline

    def note(self, args: Sequence[Any]) -> None:
        """Record a script call by its EVAL form's sha (an FCALL by its function's)."""
        command = str(args[0]).upper()
        if command not in ("EVAL", "EVALSHA", "FCALL"):
            return
        body, numkeys = args[1], int(args[2])
        if command == "FCALL":
            sha = _FUNCTION_SHAS[body]
        else:
            sha = body if command == "EVALSHA" else hashlib.sha1(body.encode()).hexdigest()
        self.calls.append((sha, tuple(str(k) for k in args[3:3 + numkeys])))

    def execute_command(self, *args: Any, **options: Any) -> Any:  # FCALL goes this way
        self.note(args)
        return self._client.execute_command(*args, **options)

    def evalsha(self, sha: str, numkeys: int, *rest: Any) -> Any:
        self.note(("EVALSHA", sha, numkeys, *rest))
        return self._client.evalsha(sha, numkeys, *rest)

    def eval(self, source: str, numkeys: int, *rest: Any) -> Any:
        self.note(("EVAL", source, numkeys, *rest))
        return self._client.eval(source, numkeys, *rest)

    def pipeline(self, transaction: bool | None = None) -> _RecordingPipeline:
        return _RecordingPipeline(self._client.pipeline(transaction=transaction), self)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._client, attr)


def exercise(name: str, client: Any) -> None:
    """Every op of every component for one name, through `client`."""
    window = {"sliding_window_size": 4, "minimum_number_of_calls": 2,
              "wait_duration_in_open_state": 60}
    breaker = CircuitBreaker(name, redis=client, **window)
    assert breaker.call(lambda: "ok") == "ok"
    with pytest.raises(ZeroDivisionError):
        breaker.call(lambda: 1 / 0)
    assert breaker.metrics().calls == 2
    breaker.trip(reason="slot test")
    assert breaker.state.value == "OPEN"
    breaker.reset()
    bulkhead = Bulkhead(name, redis=client, max_concurrent_calls=1)
    with bulkhead:
        assert bulkhead.metrics().in_use == 1
    budget = RetryBudget(name, redis=client, percent_can_retry=0.5, min_retries_per_sec=0)
    assert budget.deposit(4) == 2 and budget.try_withdraw()
    policy = Policy(name, redis=client, breaker=window, bulkhead={"max_concurrent_calls": 2},
                    retry={"max_attempts": 2, "base": 0.0, "cap": 0.0},
                    budget={"min_retries_per_sec": 1})
    assert policy.call(lambda: "composed") == "composed"  # merged deposit+release+record
    limiter = RateLimiter(name, redis=client, limit_for_period=2, limit_refresh_period=3600,
                          timeout_duration=0)
    assert limiter.try_acquire() and limiter.drain().available_permissions == 0
    assert limiter.change_limit_for_period(5).overridden and not limiter.reset_limit().overridden
    pool = Pool(name, redis=client, members=["a", "b"], consecutive_5xx=1,
                max_ejection_percent=50)
    pool.record(pool.pick(), status=500)
    assert pool.status().ejected == 1 and pool.uneject(pool.status().members[0].member)


def test_every_script_runs_on_the_cluster_with_one_slot_per_call(
        cluster_client: RedisCluster) -> None:
    scripts = {load_script(path.stem).sha: path.stem for path in lua_dir().glob("*.lua")}
    assert set(scripts.values()) == {"breaker", "bulkhead", "budget", "ganesha", "finish",
                                     "ratelimiter", "inject", "pool"}
    seen: set[str] = set()
    for name in NAME_SHAPES:
        recorder = Recorder(cluster_client)
        exercise(name, recorder)
        assert "finish" in {scripts[sha] for sha, _ in recorder.calls}, \
            "the Policy's deposit + release + record as one merged call (lua/finish.lua)"
        slots = {slot(key) for _, keys in recorder.calls for key in keys}
        assert slots == {slot(schema_keys(name)[0])}, name
        seen |= {scripts[sha] for sha, _ in recorder.calls}
    # Ganesha mode uses Ganesha's own key layout: a cluster needs a tag in the service name.
    recorder = Recorder(cluster_client)
    ganesha = GaneshaBreaker("{checkout}", redis=recorder)
    assert ganesha.is_available()
    ganesha.failure()
    ganesha.success()
    reply = ganesha.counts()
    assert reply is not None and (reply.failures, reply.successes) == (1, 1)
    assert len({slot(key) for _, keys in recorder.calls for key in keys}) == 1
    seen |= {scripts[sha] for sha, _ in recorder.calls}
    # Fault injection keeps its keys of a prefix in one slot of their own.
    recorder = Recorder(cluster_client)
    faults.inject(recorder, DEFAULT_PREFIX, "llm:*", "reject", for_=1, require_allowed=False)
    assert faults.stop(recorder, DEFAULT_PREFIX) == 1
    assert len({slot(key) for _, keys in recorder.calls for key in keys}) == 1
    seen |= {scripts[sha] for sha, _ in recorder.calls}
    assert seen == set(scripts.values())


def test_names_spread_over_all_primaries(cluster_client: RedisCluster) -> None:
    """The shapes above do not all land on one node (the cluster test is not a one-node test)."""
    nodes = {cluster_client.get_node_from_key(schema_keys(name)[0]).name
             for name in NAME_SHAPES}
    assert len(nodes) == 3
